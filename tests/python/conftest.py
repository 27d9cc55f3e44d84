"""Shared helpers of the Python package's tests: small specs, and the `moekit` command for
cross-checks against the C++ program (MOEKIT_CLI, set by scripts/test.sh)."""

import os
import shutil
import subprocess

import numpy as np
import pytest

import moekit


def small_spec(**overrides):
    """A small qwen3-shaped layer the CPU reference runs in milliseconds (fp16: numpy has it)."""
    base = dict(num_experts=8, top_k=2, hidden=64, intermediate=32, act_dtype="fp16",
                weights={"format": "fp16"}, max_tokens=16)
    return moekit.Spec.from_preset("qwen3-30b-a3b", **{**base, **overrides})


def inputs(spec, tokens, seed=0):
    rng = np.random.default_rng(seed)
    dtype = {"fp16": np.float16, "fp32": np.float32}[spec.act_dtype]
    hidden = rng.standard_normal((tokens, spec.hidden)).astype(dtype)
    if spec.routing["method"] == "external":
        ids = np.stack([rng.permutation(spec.num_experts)[: spec.top_k] for _ in range(tokens)])
        weights = rng.random((tokens, spec.top_k), dtype=np.float32)
        return dict(hidden=hidden, topk_ids=ids.astype(np.int32), topk_weights=weights)
    logits = rng.standard_normal((tokens, spec.num_experts)).astype(np.float32)
    return dict(hidden=hidden, router_logits=logits)


@pytest.fixture(scope="session")
def cli():
    """The `moekit` program built from the same tree, or a skip saying how to give it."""
    path = os.environ.get("MOEKIT_CLI") or shutil.which("moekit")
    if not path or not os.access(path, os.X_OK):
        pytest.skip("no `moekit` program: set MOEKIT_CLI=build/<config>/tools/moekit "
                    "(scripts/test.sh does) to compare with the C++ command")
    return path


def run_cli(cli, args):
    done = subprocess.run([cli, *args], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout
