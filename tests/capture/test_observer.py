"""The capture package's structure: observers follow one declared protocol and see the executor
only through its handle; capture modules import tvm_probe modules at the top."""
from __future__ import annotations

import ast
import doctest
import subprocess
import sys
from pathlib import Path

import pytest

from tvm_probe.capture import observer
from tvm_probe.capture.fast_call import FastCall
from tvm_probe.capture.kernel_hook import HookedRun
from tvm_probe.capture.native_driver import HookedNativeCalls, NativeCalls
from tvm_probe.capture.observer import ExecutorHandle, NothingObserved, Observer
from tvm_probe.capture.python_instrument import PythonCalls

CAPTURE = Path(observer.__file__).parent
#: the modules the executor hands its handle to: none may import the executor
HANDED = ["observer", "python_instrument", "native_driver", "fast_call", "kernel_hook", "transfer", "plan", "result"]


def test_the_protocol_docstring_example_runs():
    result = doctest.testmod(observer, raise_on_error=False, verbose=False)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("cls", [NothingObserved, HookedRun, PythonCalls, NativeCalls, HookedNativeCalls])
def test_every_observer_implements_the_protocol(cls):
    assert issubclass(cls, Observer)
    for method in ("__enter__", "__exit__", "call", "reraise", "running_site", "fetch", "finish"):
        assert callable(getattr(cls, method))


def _tree(name: str) -> ast.Module:
    return ast.parse((CAPTURE / f"{name}.py").read_text())


@pytest.mark.parametrize("name", HANDED)
def test_observers_do_not_import_the_executor(name):
    imported = {node.module for node in ast.walk(_tree(name)) if isinstance(node, ast.ImportFrom)}
    assert "executor" not in imported and "tvm_probe.capture.executor" not in imported


@pytest.mark.parametrize("name", HANDED + ["executor"])
def test_no_module_reads_another_objects_privates(name):
    """``x._private`` only on ``self`` (TVM's own VM set-up excepted: see kernel_hook)."""
    reads = []
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            value = node.value
            if isinstance(value, ast.Name) and value.id in ("self", "cls"):
                continue
            if ast.unparse(node) == "VirtualMachine._setup_device":
                continue
            reads.append(f"{name}.py:{node.lineno} {ast.unparse(node)}")
    assert reads == []


def test_the_handle_is_all_a_prepared_call_keeps_of_the_executor():
    assert "_handle" in FastCall.__slots__ and "_executor" not in FastCall.__slots__
    assert set(ExecutorHandle.__slots__) == {"kernel_map", "sources", "function", "device_sync", "install",
                                              "to_device", "give_up_aliased", "rerun_instrumented", "watch_table"}


def test_tvm_probe_modules_are_imported_at_the_top():
    """Inside functions, capture modules import third-party modules only (TVM, loaded lazily so
    that importing tvm_probe.capture stays light), never another tvm_probe module."""
    deferred = []
    for path in sorted(CAPTURE.rglob("*.py")):
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("tvm_probe")):
                    deferred.append(f"{path.relative_to(CAPTURE)}:{node.lineno}")
                elif isinstance(node, ast.Import) and any(a.name.startswith("tvm_probe") for a in node.names):
                    deferred.append(f"{path.relative_to(CAPTURE)}:{node.lineno}")
    assert deferred == []


def test_the_capture_package_imports_first_and_light():
    """``tvm-probe serve`` and ``tvm_probe.Instrument`` import the capture package first of all
    tvm_probe's stages; that works, and loads no TVM (the config imports capture.remote.spec)."""
    code = ("import sys, tvm_probe.capture, tvm_probe.capture.remote; "
            "print(sorted({'tvm', 'tvm_ffi', 'tvm.rpc'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=CAPTURE.parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
