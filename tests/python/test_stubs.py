"""The installed package ships typing: the extension's stubs (nanobind's stubgen) and py.typed."""

import ast
import importlib.util
import pathlib

import moekit


def test_stubs_parse_and_name_the_module_api():
    folder = pathlib.Path(moekit.__file__).parent
    assert (folder / "py.typed").exists()
    stub = folder / "_moekit.pyi"
    tree = ast.parse(stub.read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    assert {"NativeSpec", "NativeWeights", "NativeLayer", "presets", "resolve"} <= names


def test_torch_op_imports_only_with_torch():
    has_torch = importlib.util.find_spec("torch") is not None
    import sys
    if not has_torch:
        assert "moekit.torch_op" not in sys.modules
