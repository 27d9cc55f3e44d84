"""moekit with PyTorch: torch tensors in and out without copies, the custom ops, torch's current
stream, CUDA graph capture and torch.compile, against the CPU reference.

The tests whose names hold "gpu" need a CUDA GPU that a moekit GPU implementation runs on (a
CUDA build of the package on an SM 90 machine); the others need torch alone (CPU tensors on the
CPU reference). Without torch, or without such a GPU, they skip and say why. On a GPU machine:
    MOEKIT_CLI=build/cuda/tools/moekit python -m pytest tests/python -k gpu -s
(-s shows the timing table of test_gpu_call_overhead).
"""

import json
import os
import statistics
import subprocess

import numpy as np
import pytest

import moekit
from conftest import inputs, small_spec

torch = pytest.importorskip("torch", reason="torch is not installed: the torch tests skip")

import moekit.torch_op  # noqa: E402  (registers torch.ops.moekit.*)


def torch_inputs(spec, tokens, device="cpu", dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[
        spec.act_dtype]
    hidden = torch.randn(tokens, spec.hidden, generator=g).to(dtype)
    logits = torch.randn(tokens, spec.num_experts, generator=g)
    return hidden.to(device), logits.to(device)


# ---- torch on the CPU reference ------------------------------------------------------------------


def test_torch_cpu_tensors_match_numpy():
    spec = small_spec()
    layer = moekit.MoeLayer(spec, moekit.Weights.random(spec, 1), device="cpu")
    args = inputs(spec, tokens=5)
    expected = layer(args["hidden"], args["router_logits"])
    h, lg = torch.from_numpy(args["hidden"]), torch.from_numpy(args["router_logits"])
    out = layer(h, lg)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.float16
    assert np.array_equal(out.numpy(), expected)
    given = torch.empty_like(h)
    assert layer(h, lg, out=given).data_ptr() == given.data_ptr()
    assert torch.equal(torch.ops.moekit.moe_forward(layer._torch_op_id(), h, lg, None, None), out)


def test_torch_weights_dict_and_bf16():
    spec = small_spec(act_dtype="bf16", weights={"format": "bf16"})
    w = moekit.Weights.random(spec, 2)
    tensors = {k: torch.from_dlpack(v) if not isinstance(v, np.ndarray) else torch.from_numpy(v)
               for k, v in w.tensors().items()}
    assert tensors["fc1.values"].dtype == torch.bfloat16
    h, lg = torch_inputs(spec, 4)
    assert torch.equal(moekit.MoeLayer(spec, tensors, device="cpu")(h, lg),
                       moekit.MoeLayer(spec, w, device="cpu")(h, lg))


def test_torch_op_schema_and_fake():
    spec = small_spec()
    layer = moekit.MoeLayer(spec, moekit.Weights.random(spec, 1), device="cpu")
    h, lg = torch_inputs(spec, 3)
    torch.library.opcheck(torch.ops.moekit.moe_forward.default,
                          (layer._torch_op_id(), h, lg, None, None))
    torch.library.opcheck(torch.ops.moekit.moe_forward_out.default,
                          (layer._torch_op_id(), h, lg, None, None, torch.empty_like(h)))


class MoeBlock(torch.nn.Module):
    """What a model does with the layer: a residual around it."""

    def __init__(self, layer):
        super().__init__()
        self.layer = layer

    def forward(self, hidden, router_logits):
        return hidden + self.layer(hidden, router_logits)


def test_torch_compile_traces_the_op():
    spec = small_spec()
    block = MoeBlock(moekit.MoeLayer(spec, moekit.Weights.random(spec, 1), device="cpu"))
    h, lg = torch_inputs(spec, 4)
    compiled = torch.compile(block, backend="aot_eager", fullgraph=True)
    assert torch.equal(compiled(h, lg), block(h, lg))

    def into(hidden, router_logits, out):
        block.layer(hidden, router_logits, out=out)
        return out * 2

    out = torch.empty_like(h)
    assert torch.equal(torch.compile(into, backend="aot_eager", fullgraph=True)(h, lg, out),
                       2 * block.layer(h, lg))


def test_torch_errors():
    spec = small_spec()
    layer = moekit.MoeLayer(spec, moekit.Weights.random(spec, 1), device="cpu")
    h, lg = torch_inputs(spec, 4)
    with pytest.raises(moekit.InvalidArgumentError):
        layer(h.float(), lg)
    with pytest.raises(moekit.InvalidArgumentError):
        layer(h.t().contiguous().t(), lg)  # a transposed (non-contiguous) view
    with pytest.raises(moekit.InvalidArgumentError):
        layer(h, lg, stream=0)
    with pytest.raises(moekit.InvalidArgumentError):  # no layer has this number
        torch.ops.moekit.moe_forward(10**9, h, lg, None, None)


# ---- GPU -----------------------------------------------------------------------------------------

# The qwen3-30b-a3b layer with 16 experts (the preset's shapes, small weights).
GPU_SPEC = dict(num_experts=16, max_tokens=64)


@pytest.fixture(scope="module")
def gpu_spec():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    spec = moekit.Spec.from_preset("qwen3-30b-a3b", **GPU_SPEC)
    r = moekit.resolve(spec)
    device_impls = [c for c in r.candidates if c.family != "reference"]
    if not any(c.chosen for c in device_impls):
        reasons = "; ".join(f"{c.id}: {c.rejection.reason}" for c in device_impls if c.rejection)
        pytest.skip(f"no moekit GPU implementation runs here ({reasons})")
    return spec


@pytest.fixture(scope="module")
def gpu_weights(gpu_spec):
    return moekit.Weights.random(gpu_spec, 1)


def close_to_reference(out, ref):
    num = (out.float().cpu() - ref.float()).pow(2).sum().item()
    den = ref.float().pow(2).sum().item()
    return (num / max(den, 1e-30)) ** 0.5 < 1e-2


def test_gpu_zero_copy_and_reference(gpu_spec, gpu_weights):
    layer = moekit.MoeLayer(gpu_spec, gpu_weights, device="cuda")
    assert layer.device.startswith("cuda") and layer.implementation != "cpu.reference"
    reference = moekit.MoeLayer(gpu_spec, gpu_weights, device="cpu")
    for tokens in (1, 7, 64):
        h, lg = torch_inputs(gpu_spec, tokens, "cuda")
        out = torch.full_like(h, float("nan"))
        got = layer(h, lg, out=out)
        assert got is out and got.data_ptr() == out.data_ptr()
        fresh = layer(h, lg)
        assert fresh.device == h.device and fresh.dtype == h.dtype
        torch.cuda.synchronize()
        assert torch.equal(fresh, out)
        assert close_to_reference(out, reference(h.cpu(), lg.cpu()))
    layer.poll_errors()


def test_gpu_current_stream(gpu_spec, gpu_weights):
    layer = moekit.MoeLayer(gpu_spec, gpu_weights, device="cuda")
    h, lg = torch_inputs(gpu_spec, 16, "cuda")
    expected = layer(h, lg)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        # Inputs made on the side stream: only that stream's order makes them ready.
        h2 = h * 1
        out = layer(h2, lg)
        out2 = layer(h2, lg, out=torch.empty_like(h2))
    side.synchronize()
    assert torch.equal(out, expected) and torch.equal(out2, expected)


def test_gpu_graph_capture_of_the_first_call(gpu_spec, gpu_weights):
    layer = moekit.MoeLayer(gpu_spec, gpu_weights, device="cuda")  # never called before
    eager = moekit.MoeLayer(gpu_spec, gpu_weights, device="cuda")
    h, lg = torch_inputs(gpu_spec, 8, "cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = layer(h, lg)
    for seed in (1, 2):
        h2, lg2 = torch_inputs(gpu_spec, 8, "cuda", seed=seed)
        h.copy_(h2)
        lg.copy_(lg2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager(h2, lg2))


def test_gpu_torch_compile(gpu_spec, gpu_weights):
    block = MoeBlock(moekit.MoeLayer(gpu_spec, gpu_weights, device="cuda"))
    compiled = torch.compile(block, fullgraph=True)
    h, lg = torch_inputs(gpu_spec, 8, "cuda")
    assert torch.equal(compiled(h, lg), block(h, lg))
    graphed = torch.compile(block, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):  # warm-up, record, replay
        got = graphed(h, lg)
    assert torch.equal(got, block(h, lg))


def test_gpu_errors(gpu_spec, gpu_weights):
    layer = moekit.MoeLayer(gpu_spec, gpu_weights, device="cuda")
    h, lg = torch_inputs(gpu_spec, 4, "cuda")
    with pytest.raises(moekit.InvalidArgumentError) as e:
        layer(h.cpu(), lg.cpu())  # host tensors to a GPU layer
    assert e.value.code == "invalid_argument"
    with pytest.raises(moekit.InvalidArgumentError):
        layer(h, lg.cpu())
    with pytest.raises(moekit.InvalidArgumentError):
        layer(h, lg, out=torch.empty_like(h).cpu())
    with pytest.raises(moekit.InvalidArgumentError):
        layer(h[:, ::2], lg)
    with pytest.raises(moekit.InvalidArgumentError):
        moekit.MoeLayer(gpu_spec, gpu_weights, device="cuda")(h.float(), lg)


def _median_us(fn, reps=200):
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times)


def test_gpu_call_overhead(tmp_path):
    """Prints the Python call's cost beside `moekit bench` (same layer, L2 not flushed): the graph
    replay runs the same kernels, so it should cost what the bench's replay costs; the eager
    call adds the Python and DLPack overhead. Prints only (no performance targets in tests)."""
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU visible to torch")
    cli = os.environ.get("MOEKIT_CLI")
    spec = moekit.Spec.from_preset("qwen3-30b-a3b", max_tokens=64)
    if moekit.resolve(spec).chosen == "cpu.reference":
        pytest.skip("no moekit GPU implementation runs here")
    bench = {}
    if cli:
        subprocess.run([cli, "bench", "--preset", "qwen3-30b-a3b", "--tokens", "1,64", "--flush",
                        "none", "--max-tokens", "64", "--json", str(tmp_path / "b.json")],
                       check=True, capture_output=True)
        rows = json.loads((tmp_path / "b.json").read_text())["rows"]
        bench = {r["tokens"]: r["median_us"] for r in rows}
    layer = moekit.MoeLayer(spec, moekit.Weights.random(spec, 1), device="cuda")
    print(f"\n{'T':>4} {'bench_us':>9} {'replay_us':>9} {'eager_us':>9} {'overhead_us':>11}")
    for tokens in (1, 64):
        h, lg = torch_inputs(spec, tokens, "cuda")
        out = torch.empty_like(h)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            layer(h, lg, out=out)
        replay = _median_us(graph.replay)
        eager = _median_us(lambda: layer(h, lg, out=out))
        b = bench.get(tokens, float("nan"))
        print(f"{tokens:>4} {b:>9.1f} {replay:>9.1f} {eager:>9.1f} {eager - replay:>11.1f}")
