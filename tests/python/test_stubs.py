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
