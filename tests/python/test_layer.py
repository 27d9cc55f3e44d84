"""MoeLayer on the CPU reference with numpy arrays through DLPack: against the `moekit` command
(bit-equal), out=, and every error path."""

import numpy as np
import pytest

import moekit
from conftest import inputs, run_cli, small_spec

# Layers that take each weights path: dense, packed 8-bit and 4-bit bytes, scales, zero points,
# AWQ scales, biases, DeepSeek-V3 groups with the correction bias, gpt-oss's clamp, external ids,
# Llama-4's weight on the input, TP and EP shards.
CASES = {
    "fp16": {},
    "fp32": dict(act_dtype="fp32", weights={"format": "fp32"}),
    "fp8_block128": dict(weights={"format": "fp8_block128"}, hidden=256, intermediate=128),
    "fp8": dict(weights={"format": "fp8"}),
    "mxfp4_clamped_biases": dict(weights={"format": "mxfp4"}, fc1_bias=True, fc2_bias=True,
                                 gate_up_layout="interleaved",
                                 activation={"kind": "swiglu_clamped", "limit": 7.0,
                                             "alpha": 1.702, "beta": 1.0}),
    "int4_zero_points_awq": dict(weights={"format": "int4_group", "group_size": 32,
                                          "zero_points": True, "pre_quant_scale": True}),
    "nvfp4": dict(weights={"format": "nvfp4"}),
    "deepseek_groups": dict(routing={"method": "deepseek_v3", "n_group": 4, "topk_group": 2,
                                     "routed_scaling_factor": 2.5, "correction_bias": True}),
    "external": dict(routing={"method": "external"}),
    "llama4_input": dict(top_k=1, routing={"method": "llama4", "weight_placement": "input"}),
    "tp": dict(tp_size=2, tp_rank=1),
    "ep": dict(ep_size=2, ep_rank=1),
}


def unsharded(spec):
    return spec.replace(tp_size=1, tp_rank=0, ep_size=1, ep_rank=0)


def forward(layer, args, **kw):
    return layer(args["hidden"], args.get("router_logits"), topk_ids=args.get("topk_ids"),
                 topk_weights=args.get("topk_weights"), **kw)


@pytest.mark.parametrize("case", list(CASES))
def test_forward_equals_the_command_bit_for_bit(cli, tmp_path, case):
    spec = small_spec(**CASES[case])
    full = moekit.Weights.random(unsharded(spec), seed=7)
    layer = moekit.MoeLayer(spec, full.tensors(), device="cpu")
    assert layer.implementation == "cpu.reference" and layer.device == "cpu"
    args = inputs(spec, tokens=5)
    out = forward(layer, args)
    assert out.dtype == args["hidden"].dtype and out.shape == args["hidden"].shape

    (tmp_path / "spec.json").write_text(spec.to_json())
    full.save(str(tmp_path / "w.safetensors"))
    moekit.save_tensors(str(tmp_path / "in.safetensors"), args)
    run_cli(cli, ["run", "--spec", str(tmp_path / "spec.json"), "--weights",
                  str(tmp_path / "w.safetensors"), "--family", "moekit", "--input",
                  str(tmp_path / "in.safetensors"), "--output", str(tmp_path / "out.safetensors"),
                  "--backend", "reference"])
    expected = moekit.load_tensors(str(tmp_path / "out.safetensors"))["output"]
    assert expected.dtype == out.dtype
    assert np.array_equal(out.view(np.uint8), expected.view(np.uint8))


def test_weights_paths_agree():
    """A dict, Weights, and weights loaded back from a file give the same output."""
    spec = small_spec()
    w = moekit.Weights.random(spec, seed=3)
    args = inputs(spec, tokens=4)
    a = forward(moekit.MoeLayer(spec, w, device="cpu"), args)
    b = forward(moekit.MoeLayer(spec, w.tensors(), device="cpu"), args)
    assert np.array_equal(a, b)


def test_load_weights_from_a_checkpoint(tmp_path):
    spec = moekit.Spec.from_preset("qwen3-30b-a3b", num_experts=8, top_k=2, hidden=64,
                                   intermediate=32, act_dtype="fp16", weights={"format": "fp16"})
    w = moekit.Weights.random(spec, seed=5)
    w.save(str(tmp_path / "model.safetensors"), family="qwen3_moe", layer=3)
    # The preset's family (qwen3_moe) by default; a folder works like a file.
    loaded = moekit.load_weights(str(tmp_path), spec, layer=3)
    args = inputs(spec, tokens=3)
    assert np.array_equal(forward(moekit.MoeLayer(spec, loaded, device="cpu"), args),
                          forward(moekit.MoeLayer(spec, w, device="cpu"), args))
    with pytest.raises(moekit.BadFileError):
        moekit.load_weights([str(tmp_path / "model.safetensors")], spec, layer=4)
    with pytest.raises(moekit.FileAccessError):
        moekit.load_weights(str(tmp_path / "missing.safetensors"), spec)
    with pytest.raises(moekit.InvalidArgumentError):
        moekit.load_weights(str(tmp_path), moekit.Spec(**spec.to_dict()))  # no family known
    with pytest.raises(moekit.NotFoundError):
        moekit.load_weights(str(tmp_path), spec, family="no_such_family")


def test_out_is_written_in_place():
    spec = small_spec()
    layer = moekit.MoeLayer(spec, moekit.Weights.random(spec, 1), device="cpu")
    args = inputs(spec, tokens=6)
    out = np.full_like(args["hidden"], np.nan)
    pointer = out.__array_interface__["data"][0]
    got = forward(layer, args, out=out)
    assert got is out and out.__array_interface__["data"][0] == pointer
    assert np.array_equal(out, forward(layer, args))


def test_empty_batch_and_max_tokens():
    spec = small_spec()
    layer = moekit.MoeLayer(spec, moekit.Weights.random(spec, 1), max_tokens=4,
                            device="cpu")
    assert layer.spec.max_tokens == 4
    assert forward(layer, inputs(spec, tokens=0)).shape == (0, 64)
    with pytest.raises(moekit.InvalidArgumentError) as e:
        forward(layer, inputs(spec, tokens=5))
    assert "5" in str(e.value)


def test_layer_reports_its_resolution():
    spec = small_spec()
    layer = moekit.MoeLayer(spec, moekit.Weights.random(spec, 1), device="cpu")
    r = layer.resolution
    assert r.chosen == layer.implementation and r.spec == spec
    assert layer.workspace_bytes >= 0
    layer.poll_errors()


@pytest.fixture(scope="module")
def layer_and_args():
    spec = small_spec()
    return (moekit.MoeLayer(spec, moekit.Weights.random(spec, 1), device="cpu"),
            inputs(spec, tokens=4))


def _code(exc_info):
    assert isinstance(exc_info.value, moekit.Error)
    return exc_info.value.code


@pytest.mark.parametrize("what, make", [
    ("wrong dtype", lambda a: dict(a, hidden=a["hidden"].astype(np.float32))),
    ("wrong logits dtype", lambda a: dict(a, router_logits=a["router_logits"].astype(np.float16))),
    ("dtype moekit lacks", lambda a: dict(a, hidden=a["hidden"].astype(np.float64))),
    ("wrong shape", lambda a: dict(a, hidden=a["hidden"][:, :32].copy())),
    ("three dimensions", lambda a: dict(a, hidden=a["hidden"][None])),
    ("logits of other tokens", lambda a: dict(a, router_logits=a["router_logits"][:3].copy())),
    ("non-contiguous", lambda a: dict(a, hidden=np.asfortranarray(a["hidden"]))),
    ("strided rows", lambda a: dict(a, hidden=np.repeat(a["hidden"], 2, axis=0)[::2])),
    ("reversed rows", lambda a: dict(a, hidden=a["hidden"][::-1])),
    ("broadcast", lambda a: dict(a, hidden=np.broadcast_to(a["hidden"][:1], (4, 64)))),
    ("bool", lambda a: dict(a, router_logits=a["router_logits"] > 0)),
    ("not a tensor", lambda a: dict(a, router_logits=[[0.0] * 8] * 4)),
    ("no routing input", lambda a: dict(a, router_logits=None)),
])
def test_bad_inputs_are_invalid_argument(layer_and_args, what, make):
    layer, args = layer_and_args
    with pytest.raises(moekit.InvalidArgumentError) as e:
        forward(layer, make(args))
    assert _code(e) == "invalid_argument"


def test_bad_outputs_are_invalid_argument(layer_and_args):
    layer, args = layer_and_args
    for out in (np.empty((4, 64), np.float32), np.empty((4, 32), np.float16),
                np.empty((64, 4), np.float16).T, "out"):
        with pytest.raises(moekit.InvalidArgumentError):
            forward(layer, args, out=out)
    with pytest.raises(moekit.InvalidArgumentError) as e:
        forward(layer, args, out=args["hidden"])  # in place: the engines read while they write
    assert "hidden" in str(e.value)
    readonly = np.empty((4, 64), np.float16)
    readonly.flags.writeable = False
    with pytest.raises(moekit.InvalidArgumentError) as e:
        forward(layer, args, out=readonly)
    assert "read-only" in str(e.value)


def test_external_ids_out_of_range():
    spec = small_spec(routing={"method": "external"})
    layer = moekit.MoeLayer(spec, moekit.Weights.random(spec, 1), device="cpu")
    args = inputs(spec, tokens=3)
    args["topk_ids"][1, 0] = 99
    with pytest.raises(moekit.InvalidArgumentError) as e:
        forward(layer, args)
    assert "99" in str(e.value)


def test_bad_weights_dicts():
    spec = small_spec(fc1_bias=True)
    good = moekit.Weights.random(spec, 1).tensors()
    assert set(good) == {"fc1.values", "fc2.values", "fc1_bias"}
    bad = {
        "missing": {k: v for k, v in good.items() if k != "fc1_bias"},
        "unknown key": dict(good, extra=good["fc1_bias"]),
        "wrong dtype": dict(good, **{"fc1.values": good["fc1.values"].astype(np.float32)}),
        "wrong shape": dict(good, **{"fc2.values": good["fc2.values"][:4].copy()}),
        "non-contiguous": dict(good, **{"fc2.values": np.asfortranarray(good["fc2.values"])}),
        "not a tensor": dict(good, fc1_bias="zeros"),
    }
    for what, tensors in bad.items():
        with pytest.raises(moekit.InvalidArgumentError) as e:
            moekit.MoeLayer(spec, tensors)
        assert _code(e) == "invalid_argument", what
    with pytest.raises(moekit.InvalidArgumentError):
        moekit.MoeLayer(spec, [1, 2, 3])


def test_nan_e8m0_scale_is_refused():
    spec = small_spec(weights={"format": "mxfp4"})
    tensors = moekit.Weights.random(spec, 1).tensors()
    tensors["fc2.scales"] = tensors["fc2.scales"].copy()
    tensors["fc2.scales"][1, 2, 0] = 0xFF
    with pytest.raises(moekit.InvalidArgumentError):
        moekit.MoeLayer(spec, tensors)


def test_weights_of_another_format():
    spec = small_spec()
    other = moekit.Weights.random(small_spec(weights={"format": "fp8"}), 1)
    with pytest.raises(moekit.FormatMismatchError) as e:
        moekit.MoeLayer(spec, other)
    assert _code(e) == "format_mismatch"


def test_nothing_fits():
    spec = small_spec(act_dtype="bf16", weights={"format": "bf16"})
    w = moekit.Weights.random(spec, 1)
    if not moekit.environment()["gpus"]:
        with pytest.raises(moekit.UnsupportedError) as e:
            moekit.MoeLayer(spec, w, backend="cutlass")
        assert _code(e) == "unsupported"
        with pytest.raises(moekit.UnsupportedError) as e:
            moekit.MoeLayer(spec, w, device="cuda")
        assert "cuda.sm90.cutlass.bf16" in str(e.value)  # why each GPU implementation was not used
    with pytest.raises(moekit.NotFoundError):
        moekit.MoeLayer(spec, w, backend="no.such.implementation")
    with pytest.raises(moekit.InvalidSpecError):
        moekit.MoeLayer(small_spec(top_k=0), w)
    with pytest.raises(moekit.InvalidArgumentError):
        moekit.MoeLayer(spec, w, device="tpu")
    with pytest.raises(moekit.InvalidArgumentError):
        moekit.MoeLayer(42, w)


def test_hidden_that_is_not_a_tensor():
    spec = small_spec()
    layer = moekit.MoeLayer(spec, moekit.Weights.random(spec, 1), device="cpu")
    args = inputs(spec, tokens=2)
    with pytest.raises(moekit.InvalidArgumentError):
        layer(args["hidden"].tolist(), args["router_logits"])
    with pytest.raises(moekit.InvalidArgumentError):
        layer(args["hidden"].tolist(), args["router_logits"], out=np.empty_like(args["hidden"]))


def test_tensor_files_round_trip(tmp_path):
    arrays = {"a": np.arange(6, dtype=np.int32).reshape(2, 3), "b": np.ones(4, np.float16)}
    moekit.save_tensors(str(tmp_path / "t.safetensors"), arrays, {"note": "x"})
    back = moekit.load_tensors(str(tmp_path / "t.safetensors"))
    assert set(back) == {"a", "b"}
    for k in arrays:
        assert back[k].dtype == arrays[k].dtype and np.array_equal(back[k], arrays[k])
    with pytest.raises(moekit.BadFileError):
        (tmp_path / "junk.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{bad}")
        moekit.load_tensors(str(tmp_path / "junk.safetensors"))
    with pytest.raises(moekit.InvalidArgumentError):
        moekit.save_tensors(str(tmp_path / "f.safetensors"), {"x": np.zeros(2, np.float64)})
