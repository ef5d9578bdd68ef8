"""The package itself: light to import, and its documented examples run."""
from __future__ import annotations

import subprocess
import sys

import numpy as np


def test_importing_tvm_probe_pulls_in_nothing_heavy():
    code = ("import sys, tvm_probe; heavy = {'tvm', 'onnx', 'onnxruntime', 'torch', 'pandas'}; "
            "print(sorted(heavy & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_package_docstring_example_runs():
    import tvm_probe

    example = tvm_probe.__doc__.split("\n\n")[1]
    scope: dict = {}
    exec(compile("\n".join(line[4:] for line in example.splitlines()), "tvm_probe.__doc__", "exec"), scope)
    from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values

    probe, model = scope["probe"], scope["model"]
    key = probe.resolve("layer_._0/attention/self/MatMul")
    expected = onnxruntime_values(model, tvm_probe.demo.demo_inputs(model), [key])[key]
    np.testing.assert_allclose(probe.get("layer_._0/attention/self/MatMul"), expected, rtol=1e-3, atol=1e-4)


def test_every_old_import_path_is_the_module_now_in_its_stage():
    """Users' scripts written before the stages became packages keep working: ``tvm_probe.hf`` is
    the very module ``tvm_probe.llm.hf`` (one object: monkeypatching and isinstance see one thing)."""
    code = ("import importlib, json, tvm_probe; from tvm_probe._moved import MOVED; "
            "print(json.dumps({old: importlib.import_module('tvm_probe.' + old) is "
            "importlib.import_module('tvm_probe.' + new) for old, new in MOVED.items()}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    import json

    same = json.loads(out)
    assert same and all(same.values()), [old for old, ok in same.items() if not ok]


def test_the_old_module_path_of_compare_leaves_the_function_in_place():
    import tvm_probe
    from tvm_probe.compare import Comparison  # the old module path (now tvm_probe.comparison)

    assert callable(tvm_probe.compare) and Comparison is tvm_probe.Comparison


def test_python_dash_m_runs_the_cli():
    out = subprocess.run([sys.executable, "-m", "tvm_probe", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "usage: tvm-probe" in out.stdout


def test_the_public_names_are_importable():
    import tvm_probe

    missing = [name for name in tvm_probe.__all__ if not hasattr(tvm_probe, name)]
    assert not missing and "Instrument" in tvm_probe.__all__
