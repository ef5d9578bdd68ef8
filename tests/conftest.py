"""Shared fixtures: real models compiled with real TVM, references from real onnxruntime.

Probes are expensive to build (TVM compiles every kernel), so they are built once per session
and per pipeline, and every test reads from them.
"""
from __future__ import annotations

import os

# pytest-xdist runs the suite in several worker processes (``-n auto`` in setup.cfg).  TVM's CPU
# thread pool spins while it waits, so two workers each running one thread per core would fight
# over the cores; one TVM thread (and one torch/OpenMP thread) per worker keeps every core busy
# with one worker.  Set before any test imports tvm or torch; subprocesses inherit it.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for variable in ("TVM_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(variable, "1")

import pytest  # noqa: E402

from tvm_probe.core.schema import PIPELINES  # noqa: E402

# No sys.path entry is added here: pytest's default (prepend) import mode puts tests/ on sys.path to
# import this file, which is how tests import the ``support`` package.
from support.session import SERVED_COUNTS  # noqa: E402
from tvm_probe import demo  # noqa: E402
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values  # noqa: E402


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core, at most 4 (each worker holds its own compiled models)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()  # (macOS: no affinity)
    return max(1, min(4, cores or 1))


def pytest_sessionfinish(session):
    """In an xdist worker, hand the served counts to the controller, which prints the summary."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["served_counts"] = SERVED_COUNTS


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """In the xdist controller: gather the served counts a worker measured."""
    SERVED_COUNTS.update(getattr(node, "workeroutput", {}).get("served_counts", {}))


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
