#!/usr/bin/env python3
"""The same MoE layer through PyTorch, for comparison with `moekit bench` (run on the device).

Two forwards per preset and token count, both BF16, routing included:
  loop     a per-expert Python loop (what a naive engine does),
  grouped  sort-by-expert with torch._grouped_mm (PyTorch's own grouped GEMM).
Times are medians of CUDA-event timings, L2 emptied between reps the way `moekit bench --flush`
does (default: read 256 MiB, leaving the L2 clean; `write` zeroes 256 MiB as triton's do_bench).
With --moekit-json, prints the moekit/torch time ratio per row (< 1 means moekit is faster).
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


def make_layer(name):
    e, k, hdim, inter, routing, activation = PRESETS[name]
    g = torch.Generator(device="cuda").manual_seed(0)
    w13 = (torch.randn(e, 2 * inter, hdim, device="cuda", generator=g) / math.sqrt(hdim)).bfloat16()
    w2 = (torch.randn(e, hdim, inter, device="cuda", generator=g) / math.sqrt(inter)).bfloat16()
    bias = torch.randn(e, device="cuda", generator=g) * 0.1
    return dict(e=e, k=k, h=hdim, i=inter, routing=routing, act=activation, w13=w13, w2=w2, bias=bias)


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
    ap.add_argument("--moekit-json", nargs="*", default=[])
    ap.add_argument("--json-out")
    ap.add_argument("--flush", choices=["read", "write", "none"], default="read")
    a = ap.parse_args()

    ours = {}
    for path in a.moekit_json:
        try:
            for row in json.load(open(path))["rows"]:
                ours[(row["preset"], row["tokens"])] = row["median_us"]
        except (OSError, KeyError, ValueError) as err:
            print(f"cannot read {path}: {err}", file=sys.stderr)
    print(f"# torch {torch.__version__} on {torch.cuda.get_device_name()}; medians of CUDA events, L2 flush: {a.flush}, bf16")
    print(f"{'preset':16} {'T':>6} {'loop us':>10} {'grouped us':>11} {'moekit us':>10} {'m/loop':>7} {'m/grouped':>9}")
    results = []
    for name in a.presets.split(","):
        L = make_layer(name)
        for t in [int(s) for s in a.tokens.split(",")]:
            x = torch.randn(t, L["h"], device="cuda").bfloat16()
            logits = torch.randn(t, L["e"], device="cuda")
            ref = forward_grouped(L, x, logits)
            if t <= 4096:  # the two torch forwards agree (sanity of this script)
                err = (forward_loop(L, x, logits).float() - ref.float()).norm() / ref.float().norm()
                assert err < 2e-2, f"{name} T={t}: loop vs grouped rel err {err:.3g}"
            tl = time_us(lambda: forward_loop(L, x, logits), a.flush)
            tg = time_us(lambda: forward_grouped(L, x, logits), a.flush)
            m = ours.get((name, t))
            r1 = f"{m / tl:7.2f}" if m else "      -"
            r2 = f"{m / tg:9.2f}" if m else "        -"
            ms = f"{m:10.1f}" if m else "         -"
            print(f"{name:16} {t:6d} {tl:10.1f} {tg:11.1f} {ms} {r1} {r2}", flush=True)
            results.append(dict(preset=name, tokens=t, loop_us=tl, grouped_us=tg, moekit_us=m, l2_flush=a.flush))
        del L
        torch.cuda.empty_cache()
    if a.json_out:
        json.dump(results, open(a.json_out, "w"), indent=1)


if __name__ == "__main__":
    main()
