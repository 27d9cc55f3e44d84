"""Spec, presets and the resolver from Python."""

import json
import math
import subprocess

import pytest

import moekit
from conftest import small_spec


def test_presets_list_every_builtin_layer():
    names = [p.name for p in moekit.presets()]
    assert "qwen3-30b-a3b" in names and "deepseek-v3" in names
    for p in moekit.presets():
        assert p.spec == moekit.Spec.from_preset(p.name)
        assert p.family in moekit.model_families()
        p.spec.validate()


def test_every_field_round_trips():
    spec = moekit.Spec(
        num_experts=32, top_k=4, hidden=256, intermediate=128, act_dtype="fp16",
        weights={"format": "int4_group", "group_size": 64, "zero_points": True,
                 "pre_quant_scale": True},
        activation={"kind": "swiglu_clamped", "limit": 7.0, "alpha": 1.702, "beta": 1.0},
        gate_up_layout="interleaved", fc1_bias=True, fc2_bias=True,
        routing={"method": "deepseek_v3", "n_group": 4, "topk_group": 2,
                 "routed_scaling_factor": 2.5, "correction_bias": True, "renormalize": False,
                 "weight_placement": "input"},
        max_tokens=128, tp_size=2, tp_rank=1, ep_size=2, ep_rank=1)
    again = moekit.Spec.from_json(spec.to_json())
    assert again == spec
    assert moekit.Spec.from_dict(spec.to_dict()) == spec
    assert spec.weights["group_size"] == 64 and spec.routing["n_group"] == 4
    assert spec.activation["alpha"] == pytest.approx(1.702)
    assert spec.gate_up_layout == "interleaved" and spec.ep_rank == 1
    assert spec.fc1_rows == 256
    local = spec.local_problem()
    assert local["num_experts"] == 16 and local["first_expert"] == 16
    assert local["intermediate"] == 64 and local["intermediate_offset"] == 64


def test_infinite_and_nan_floats_survive():
    spec = small_spec(activation={"kind": "swiglu_clamped", "limit": math.inf})
    assert spec.activation["limit"] == math.inf
    assert '"inf"' in spec.to_json()
    assert moekit.Spec.from_json(spec.to_json()) == spec


def test_numbers_of_other_libraries():
    np = pytest.importorskip("numpy")
    spec = small_spec(hidden=np.int64(128), activation={"kind": "swiglu_clamped",
                                                        "limit": np.float32("inf")})
    assert spec.hidden == 128 and spec.activation["limit"] == math.inf
    with pytest.raises(moekit.InvalidArgumentError):
        small_spec(hidden=object())
    with pytest.raises(moekit.InvalidArgumentError):
        moekit.Weights.random(small_spec(), seed=-1)


def test_from_preset_overrides_merge_nested_fields():
    base = moekit.Spec.from_preset("deepseek-v3")
    spec = moekit.Spec.from_preset("deepseek-v3", routing={"renormalize": False}, top_k=4)
    assert spec.top_k == 4 and spec.routing["renormalize"] is False
    assert spec.routing["n_group"] == base.routing["n_group"]
    assert spec.replace(top_k=8) == base.replace(routing={"renormalize": False})


def test_spec_is_immutable():
    spec = small_spec()
    with pytest.raises(AttributeError):
        spec.top_k = 3
    with pytest.raises(AttributeError):
        spec.no_such_field


def test_validate_lists_every_violation():
    spec = small_spec(top_k=20, intermediate=0, ep_size=3)
    violations = spec.violations()
    assert len(violations) >= 3
    with pytest.raises(moekit.InvalidSpecError) as e:
        spec.validate()
    assert e.value.code == "invalid_spec"
    assert isinstance(e.value, moekit.Error) and isinstance(e.value, ValueError)
    for violation in violations:
        assert violation.rstrip(".") in str(e.value)
    for word in ("top_k 20", "intermediate 0", "ep_size 3"):
        assert any(word in v for v in violations)


@pytest.mark.parametrize("fields", [
    {"no_such_key": 1},
    {"top_k": "two"},
    {"act_dtype": "fp64"},
    {"weights": {"format": "int3"}},
    {"routing": {"method": "softmax_topk", "unknown": True}},
    {"num_experts": 2 ** 70},
])
def test_bad_fields_are_invalid_argument(fields):
    with pytest.raises(moekit.InvalidArgumentError) as e:
        small_spec(**fields)
    assert e.value.code == "invalid_argument"


def test_unknown_preset_is_not_found():
    with pytest.raises(moekit.NotFoundError) as e:
        moekit.Spec.from_preset("gpt-5")
    assert e.value.code == "not_found" and "gpt-5" in str(e.value)


def test_resolve_report():
    r = moekit.resolve(small_spec())
    assert r.ok and r.chosen in [c.id for c in r.candidates]
    chosen = [c for c in r.candidates if c.chosen]
    assert len(chosen) == 1 and chosen[0].eligible and chosen[0].rejection is None
    for c in r.candidates:
        assert c.eligible or (c.rejection.stage and c.rejection.reason)
    assert json.loads(r.json)["chosen"] == r.chosen
    assert r.spec == small_spec()


def test_resolve_degrades_or_refuses_with_reasons():
    r = moekit.resolve(small_spec(weights={"format": "bf16"}, act_dtype="bf16"), "cutlass")
    if not moekit.environment()["gpus"]:
        assert not r.ok and r.chosen is None
        assert r.degraded_from.requested == "cutlass"
        assert r.degraded_from.reason.stage in ("gpu_generation", "build")
    with pytest.raises(moekit.NotFoundError):
        moekit.resolve(small_spec(), "no.such.implementation")
    with pytest.raises(moekit.InvalidSpecError):
        moekit.resolve(small_spec(top_k=0))


@pytest.mark.parametrize("preset", ["qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b"])
@pytest.mark.parametrize("backend", ["auto", "reference", "cutlass"])
def test_resolve_json_equals_the_command(cli, preset, backend):
    # The command's --max-tokens defaults to the tokens asked for (1 for resolve); it exits 1
    # when nothing can run the layer, after printing the same report.
    spec = moekit.Spec.from_preset(preset, max_tokens=1)
    done = subprocess.run([cli, "resolve", "--preset", preset, "--backend", backend, "--json"],
                          capture_output=True, text=True)
    ours = moekit.resolve(spec, backend)
    assert done.returncode == (0 if ours.ok else 1), done.stderr
    assert ours.json + "\n" == done.stdout
