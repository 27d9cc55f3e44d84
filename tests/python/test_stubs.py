"""The installed package ships typing: the extension's stubs (nanobind's stubgen) and py.typed."""

import ast
import pathlib
import subprocess
import sys

import pytest

import moekit


def test_stubs_parse_and_name_the_module_api():
    folder = pathlib.Path(moekit.__file__).parent
    assert (folder / "py.typed").exists()
    stub = folder / "_moekit.pyi"
    if not stub.exists() and "site-packages" not in str(folder):
        pytest.skip("moekit comes from a CMake build tree, where the _moekit_stub target (which "
                    "pip install . builds) writes the stubs")
    tree = ast.parse(stub.read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert {"NativeSpec", "NativeWeights", "NativeLayer", "presets", "resolve"} <= names


def test_importing_moekit_imports_no_framework():
    code = "import sys, moekit; sys.exit(any(m in sys.modules for m in ('torch', 'numpy')))"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


CLIENT = '''
import moekit
spec: moekit.Spec = moekit.Spec.from_preset("qwen3-30b-a3b", top_k=4)
report: moekit.Resolution = moekit.resolve(spec, "auto")
chosen: "str | None" = report.chosen
rows: int = spec.fc1_rows
layer = moekit.MoeLayer(spec, moekit.Weights.random(spec, seed=1), max_tokens=8)
name: str = layer.implementation
'''


def test_package_and_a_client_type_check(tmp_path):
    """mypy reads the package (its annotations and the module's stubs) and a client of it."""
    pytest.importorskip("mypy", reason="mypy is not installed (scripts/test.sh installs it)")
    (tmp_path / "client.py").write_text(CLIENT)
    for target in (["-p", "moekit"], [str(tmp_path / "client.py")]):
        done = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental",
                               "--ignore-missing-imports", *target],
                              capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
