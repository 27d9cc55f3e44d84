#!/usr/bin/env python3
"""The same MoE layer through PyTorch, for comparison with `moekit bench` (run on the device).

Two forwards per preset and token count, routing included:
  loop     a per-expert Python loop (what a naive engine does),
  grouped  sort-by-expert with PyTorch's own grouped GEMM.
--weights-format bf16 (default): BF16 weights and activations, both forwards timed, the grouped
one through torch._grouped_mm.
--weights-format fp8 | fp8_block128: the weights are quantized to e4m3 (torch.float8_e4m3fn) and
the grouped forward runs FC1 and FC2 through torch._scaled_grouped_mm with row-wise scales, the
only FP8 scaling its 2D x 3D (MoE) form takes on sm90 (aten GroupedBlas.cpp,
_scaled_grouped_mm_cuda: fp32 scales, scale_a [rows], scale_b [experts, out features]):
  - activations: quantized per token row, scale = max(amax, 1e-10) / 448, before FC1 and FC2;
  - fp8 weights: one scale per expert (amax / 448), given to PyTorch as that scale repeated
    along the expert's rows;
  - fp8_block128 weights: PyTorch has no grouped GEMM with DeepSeek's 128x128 weight blocks (nor
    1x128 activation groups), so the closest it offers is used: one scale per output row
    (amax / 448 of the row). Not moekit's numerics: moekit scales 128x128 weight blocks and
    1x128 activation groups (fp8_block128), or quantizes activations with a static per-expert
    scale (fp8); the bytes read and the FLOPs are those of moekit's layer.
  The rows of each expert are padded to a multiple of 16 (the group sizes PyTorch's own tests
  give it; test_matmul_cuda.py, test_scaled_grouped_gemm_2d_3d). The loop forward then runs in
  BF16 on the dequantized weights: it checks the grouped one and is not timed.
Times are medians of CUDA-event timings, L2 emptied between reps the way `moekit bench --flush`
does (default: read 256 MiB, leaving the L2 clean; `write` zeroes 256 MiB as triton's do_bench).
--routing replaces the presets' routing method (as `moekit bench --routing` does), e.g.
softmax_topk for DeepSeek-V3's shape with uniform routing.
With --moekit-json, prints the moekit/torch time ratio per row (< 1 means moekit is faster),
matched by preset, token count, weight format and routing method.
"""
import argparse
import json
import math
import sys

import torch
import torch.nn.functional as F

# name: (experts, top_k, hidden, intermediate, routing, activation)
PRESETS = {
    "qwen3-30b-a3b": (128, 8, 2048, 768, "topk_softmax", "swiglu"),
    "mixtral-8x7b": (8, 2, 4096, 14336, "topk_softmax", "swiglu"),
    "deepseek-v3": (256, 8, 7168, 2048, "deepseek_v3", "swiglu"),
    "gpt-oss-120b": (128, 4, 2880, 2880, "topk_softmax", "swiglu_clamped"),
    "llama4-maverick": (128, 1, 5120, 8192, "llama4", "swiglu"),
}


def route(logits, k, method, bias=None):
    if method == "softmax_topk":
        w, ids = torch.topk(torch.softmax(logits, -1), k, dim=-1)
    elif method == "topk_softmax":
        v, ids = torch.topk(logits, k, dim=-1)
        w = torch.softmax(v, -1)
    elif method == "llama4":
        v, ids = torch.topk(logits, 1, dim=-1)
        w = torch.sigmoid(v)
    else:  # deepseek_v3: n_group 8, topk_group 4, scaling 2.5
        s = torch.sigmoid(logits)
        sel = s + bias
        t, e = sel.shape
        g = sel.view(t, 8, e // 8).topk(2, dim=-1).values.sum(-1)
        keep = torch.zeros_like(g).scatter_(1, g.topk(4, dim=-1).indices, 1.0)
        mask = keep.unsqueeze(-1).expand(t, 8, e // 8).reshape(t, e)
        ids = sel.masked_fill(mask == 0, float("-inf")).topk(k, dim=-1).indices
        w = s.gather(1, ids)
        w = w / w.sum(-1, keepdim=True) * 2.5
    return ids, w.float()


def act(h, kind):
    i = h.shape[-1] // 2
    if kind == "swiglu":
        return F.silu(h[..., :i]) * h[..., i:]
    g, u = h[..., ::2], h[..., 1::2]  # gpt-oss: interleaved, clamped
    g = g.clamp(max=7.0)
    u = u.clamp(-7.0, 7.0)
    return g * torch.sigmoid(1.702 * g) * (u + 1)


FP8_MAX = 448.0  # largest finite float8_e4m3fn
FP8_SCALE_FLOOR = 1e-10  # an all-zero row keeps a finite scale (as moekit and DeepSeek's kernels)


def quantize_rows(x):
    """x [..., rows, cols] -> (e4m3 values, fp32 scales [..., rows]): one scale per row."""
    amax = x.abs().amax(-1, keepdim=True).float().clamp(min=FP8_SCALE_FLOOR)
    scale = amax / FP8_MAX
    q = (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, scale.squeeze(-1).contiguous()


def quantize_weights(w, fmt):
    """w [experts, out, in] bf16 -> (e4m3 [experts, out, in], fp32 scales [experts, out]).

    One expert at a time (DeepSeek-V3's FC1 in fp32 would take 30 GB). Afterwards w holds the
    dequantized weights (bf16), the loop forward's reference for the same quantized layer."""
    q = torch.empty(w.shape, dtype=torch.float8_e4m3fn, device=w.device)
    scales = torch.empty(w.shape[:2], dtype=torch.float32, device=w.device)
    for e in range(w.shape[0]):
        if fmt == "fp8":  # one scale per expert, repeated along its rows for the row-wise GEMM
            amax = w[e].abs().amax().float().clamp(min=FP8_SCALE_FLOOR)
            scales[e] = amax / FP8_MAX
            q[e] = (w[e].float() / scales[e, :, None]).clamp(-FP8_MAX, FP8_MAX).to(q.dtype)
        else:  # fp8_block128: per output row, the closest PyTorch offers
            q[e], scales[e] = quantize_rows(w[e])
        w[e] = (q[e].float() * scales[e, :, None]).bfloat16()
    return q, scales


def make_layer(name, fmt, routing=None):
    e, k, hdim, inter, preset_routing, activation = PRESETS[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    w13 = (torch.randn(e, 2 * inter, hdim, device="cuda", generator=g) / math.sqrt(hdim)).bfloat16()
    w2 = (torch.randn(e, hdim, inter, device="cuda", generator=g) / math.sqrt(inter)).bfloat16()
    bias = torch.randn(e, device="cuda", generator=g) * 0.1
    L = dict(e=e, k=k, h=hdim, i=inter, routing=routing or preset_routing, act=activation, fmt=fmt,
             bias=bias)
    if fmt == "bf16":
        L.update(w13=w13, w2=w2)
        return L
    L["q13"], L["s13"] = quantize_weights(w13, fmt)
    L["q2"], L["s2"] = quantize_weights(w2, fmt)
    L.update(w13=w13, w2=w2)  # now dequantized: the loop forward's weights
    return L


def forward_loop(L, x, logits):
    ids, w = route(logits, L["k"], L["routing"], L["bias"])
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for ex in torch.unique(ids).tolist():
        tok, slot = torch.nonzero(ids == ex, as_tuple=True)
        y = act(x[tok] @ L["w13"][ex].t(), L["act"]) @ L["w2"][ex].t()
        out.index_add_(0, tok, y.float() * w[tok, slot, None])
    return out.bfloat16()


def forward_grouped(L, x, logits):
    ids, w = route(logits, L["k"], L["routing"], L["bias"])
    flat = ids.flatten()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=L["e"])
    offs = torch.cumsum(counts, 0).to(torch.int32)
    xs = x[order // L["k"]]
    h = torch._grouped_mm(xs, L["w13"].transpose(-2, -1), offs=offs)
    y = torch._grouped_mm(act(h, L["act"]).contiguous(), L["w2"].transpose(-2, -1), offs=offs)
    out = torch.zeros(x.shape[0] * L["k"], x.shape[1], dtype=torch.float32, device=x.device)
    out[order] = y.float()
    return (out.view(x.shape[0], L["k"], -1) * w[..., None]).sum(1).bfloat16()


def forward_grouped_fp8(L, x, logits):
    """FC1 and FC2 through torch._scaled_grouped_mm, each expert's rows padded to 16."""
    ids, w = route(logits, L["k"], L["routing"], L["bias"])
    flat = ids.flatten()
    n = flat.numel()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=L["e"])
    padded = (counts + 15) // 16 * 16
    pad_end = torch.cumsum(padded, 0)
    # Sorted entry j of expert g goes to row pad_start[g] + (j - start[g]); no host sync: the
    # padded total is bounded by n + 15 * min(experts, n) (rows past the last offset are unused).
    sorted_ids = flat[order]
    shift = (pad_end - padded) - (torch.cumsum(counts, 0) - counts)
    dest = torch.arange(n, device=x.device) + shift[sorted_ids]
    rows = n + 15 * min(L["e"], n)
    xs = x.new_zeros(rows, x.shape[1])
    xs[dest] = x[order // L["k"]]
    offs = pad_end.to(torch.int32)
    xq, xscale = quantize_rows(xs)
    h = torch._scaled_grouped_mm(xq, L["q13"].transpose(-2, -1), xscale, L["s13"], offs=offs,
                                 out_dtype=torch.bfloat16)
    aq, ascale = quantize_rows(act(h, L["act"]))
    y = torch._scaled_grouped_mm(aq, L["q2"].transpose(-2, -1), ascale, L["s2"], offs=offs,
                                 out_dtype=torch.bfloat16)
    out = torch.zeros(n, x.shape[1], dtype=torch.float32, device=x.device)
    out[order] = y[dest].float()
    return (out.view(x.shape[0], L["k"], -1) * w[..., None]).sum(1).bfloat16()


def time_us(fn, flush, budget_s=0.2):
    """Median microseconds of fn() over reps (at least 5, at most 1000, about budget_s of GPU time)."""
    if getattr(time_us, "buf", None) is None:
        time_us.buf = torch.empty(64 << 20, dtype=torch.float32, device="cuda")  # 256 MiB
    buf = time_us.buf
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    while len(times) < 1000 and (len(times) < 5 or sum(times) < budget_s * 1e6):
        if flush == "read":
            buf.sum()  # reads 256 MiB, writes one value
        elif flush == "write":
            buf.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default=",".join(list(PRESETS)[:4]))
    ap.add_argument("--tokens", default="1,8,64,512,4096,16384")
    ap.add_argument("--weights-format", choices=["bf16", "fp8", "fp8_block128"], default="bf16")
    ap.add_argument("--routing", choices=["softmax_topk", "topk_softmax", "deepseek_v3", "llama4"],
                    help="routing method of every preset (default: each preset's own)")
    ap.add_argument("--moekit-json", nargs="*", default=[])
    ap.add_argument("--json-out")
    ap.add_argument("--flush", choices=["read", "write", "none"], default="read")
    a = ap.parse_args()
    for name in a.presets.split(","):
        if name not in PRESETS:
            ap.error(f"--presets: '{name}' is not one of {', '.join(PRESETS)}")
    fp8 = a.weights_format != "bf16"

    ours = {}
    for path in a.moekit_json:
        try:
            for row in json.load(open(path))["rows"]:
                key = (row["preset"], row["tokens"], row.get("weights_format", "bf16"))
                ours.setdefault(key, []).append(row)
        except (OSError, KeyError, ValueError) as err:
            print(f"cannot read {path}: {err}", file=sys.stderr)

    def moekit_us(name, t, routing):
        for row in ours.get((name, t, a.weights_format), []):
            if row.get("routing", routing) == routing:
                return row["median_us"]
        return None

    grouped_op = "torch._scaled_grouped_mm (row-wise e4m3)" if fp8 else "torch._grouped_mm"
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name()}; medians of CUDA events, "
          f"L2 flush: {a.flush}; weights {a.weights_format}; grouped: {grouped_op}")
    print(f"{'preset':16} {'T':>6} {'routing':>13} {'loop us':>10} {'grouped us':>11} {'moekit us':>10} "
          f"{'m/loop':>7} {'m/grouped':>9}")
    results = []
    for name in a.presets.split(","):
        L = make_layer(name, a.weights_format, a.routing)
        grouped = forward_grouped_fp8 if fp8 else forward_grouped
        for t in [int(s) for s in a.tokens.split(",")]:
            x = torch.randn(t, L["h"], device="cuda").bfloat16()
            logits = torch.randn(t, L["e"], device="cuda")
            ref = grouped(L, x, logits)
            if t <= 4096:  # the two torch forwards agree (sanity of this script)
                err = (forward_loop(L, x, logits).float() - ref.float()).norm() / ref.float().norm()
                # FP8: the loop keeps bf16 activations, the grouped one quantizes them to e4m3.
                tol = 8e-2 if fp8 else 2e-2
                assert err < tol, f"{name} T={t}: loop vs grouped rel err {err:.3g}"
            tl = None if fp8 else time_us(lambda: forward_loop(L, x, logits), a.flush)
            tg = time_us(lambda: grouped(L, x, logits), a.flush)
            m = moekit_us(name, t, L["routing"])
            r1 = f"{m / tl:7.2f}" if m and tl else "      -"
            r2 = f"{m / tg:9.2f}" if m else "        -"
            ms = f"{m:10.1f}" if m else "         -"
            ls = f"{tl:10.1f}" if tl else "         -"
            print(f"{name:16} {t:6d} {L['routing']:>13} {ls} {tg:11.1f} {ms} {r1} {r2}", flush=True)
            results.append(dict(preset=name, tokens=t, weights_format=a.weights_format,
                                routing=L["routing"], loop_us=tl, grouped_us=tg, moekit_us=m,
                                l2_flush=a.flush))
        del L
        torch.cuda.empty_cache()
    if a.json_out:
        json.dump(results, open(a.json_out, "w"), indent=1)


if __name__ == "__main__":
    main()
