"""Shared fixtures: real models compiled with real TVM, references from real onnxruntime.

Probes are expensive to build (TVM compiles every kernel), so they are built once per session
and per pipeline, and every test reads from them.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tvm_probe.schema import PIPELINES  # noqa: F401  (tests import it from here)

sys.path.insert(0, str(Path(__file__).parent))  # tests/models.py

from tvm_probe import demo  # noqa: E402
from tvm_probe.reference.onnxruntime import onnxruntime_values  # noqa: E402

SERVED_COUNTS: dict[str, dict[str, int]] = {}  # filled by test_bert, printed at the end


def pytest_terminal_summary(terminalreporter):
    """Report how the demo BERT's values were served, per pipeline."""
    for pipeline, counts in SERVED_COUNTS.items():
        parts = ", ".join(f"{k} {v}" for k, v in sorted(counts.items()))
        terminalreporter.write_line(f"demo BERT, {pipeline} pipeline: values served as {parts}")


@pytest.fixture
def ctrl_c():
    """Ctrl-C as an interactive shell delivers it, whatever started the tests: a shell without job
    control starts background jobs (``pytest ... &``) with SIGINT ignored, and children inherit
    that.  Python's own handler for the test; an exec'd child starts from the default action."""
    import signal

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def bert_model():
    return demo.tiny_bert()


@pytest.fixture(scope="session")
def bert_inputs(bert_model):
    return demo.demo_inputs(bert_model)


@pytest.fixture(scope="session")
def bert_reference(bert_model, bert_inputs):
    return onnxruntime_values(bert_model, bert_inputs)


@pytest.fixture(scope="session", params=PIPELINES)
def bert_probe(request, bert_model, bert_inputs):
    """The demo BERT compiled with each pipeline, after one run capturing everything."""
    from tvm_probe import Probe

    probe = Probe.from_onnx(bert_model, target="llvm", pipeline=request.param)
    probe.run(bert_inputs)
    return probe


@pytest.fixture(scope="session")
def fused_bert_probe(bert_model):
    """A fused-pipeline probe for tests that run it themselves (not yet run)."""
    from tvm_probe import Probe

    return Probe.from_onnx(bert_model, target="llvm", pipeline="fused")


def run_cli(*args, quiet: bool = True) -> subprocess.CompletedProcess:
    """``tvm-probe ARGS`` in a fresh process, as a user's shell runs it (exit status, stdout, stderr)."""
    return subprocess.run([sys.executable, "-m", "tvm_probe.cli", *(["--quiet"] if quiet else []), *map(str, args)],
                          capture_output=True, text=True)


def run_python(code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh Python process (to test imports and missing packages)."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
