"""A kernel that kills the process is named by the process that watched it (issue 55).

The crashing model (``support.crash_models``: an ONNX Gather reading 2**30 rows past its table)
segfaults in TVM's ``take`` kernel.  It runs only in child processes: ``tvm-probe`` started as a
user's shell starts it, and :func:`tvm_probe.capture.watch.run_watched`'s fork of this process.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from support.crash_models import CRASHING_CALL, crashing_gather, harmless_gather
from support.native_tools import HAS_TOOLS
from tvm_probe import Probe, load_dump
from tvm_probe.app.cli import main
from tvm_probe.capture.executor import INSTRUMENT_ENV
from tvm_probe.capture.watch import WATCH_ENV, run_watched
from tvm_probe.core.errors import InputError, KernelCrash
from tvm_probe.core.schema import Exit

ROOT = Path(__file__).parents[2]
VERDICT = ("tvm-probe: TVM failed: TVM's kernel 'take1' (source op 'gather_node' (Gather)) crashed the process "
           "with SIGSEGV at kernel call #6\n")
INPUTS = {"x": np.linspace(-1, 1, 32, dtype=np.float32).reshape(4, 8)}


def tvm_probe(*args, cwd, watch: bool = True, **env) -> subprocess.CompletedProcess:
    """``tvm-probe -q ARGS`` as a user's shell runs it, in ``cwd`` (where ./tvm_probe_out goes);
    ``watch=False``: in its own process, unwatched."""
    env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop(WATCH_ENV, None)
    if not watch:
        env[WATCH_ENV] = "0"
    return subprocess.run([sys.executable, "-m", "tvm_probe", "-q", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def leftovers(folder: Path) -> list[str]:
    """Hidden files or folders a writer left (partial dumps and reports)."""
    return sorted(p.name for p in folder.rglob(".*"))


@pytest.mark.parametrize("instrument", [
    pytest.param("native", marks=pytest.mark.skipif(not HAS_TOOLS, reason="no C++ compiler or ninja")), "python"])
def test_the_cli_names_the_kernel_that_crashed_and_exits_4(tmp_path, instrument):
    onnx.save(crashing_gather(), tmp_path / "gather.onnx")
    done = tvm_probe("run", "gather.onnx", cwd=tmp_path, **{INSTRUMENT_ENV: instrument})
    assert (done.returncode, done.stderr, done.stdout) == (Exit.TVM_FAILED, VERDICT, "")
    out = tmp_path / "tvm_probe_out" / "gather"
    assert not (out / "dump").exists() and not (out / "report").exists()
    assert leftovers(tmp_path) == []


def test_a_run_that_does_not_crash_is_unchanged(tmp_path, monkeypatch, capsys):
    onnx.save(harmless_gather(), tmp_path / "gather.onnx")
    monkeypatch.chdir(tmp_path)
    status = main(["-q", "run", "gather.onnx"])  # in this process: what the watched child does
    unwatched = capsys.readouterr().out
    watched = tvm_probe("run", "gather.onnx", cwd=tmp_path)
    assert (watched.returncode, watched.stdout, watched.stderr) == (status, unwatched, "") == (Exit.OK, unwatched, "")
    assert "dump: " in unwatched and "within tolerance" in unwatched.splitlines()[-1]


def test_a_crash_leaves_the_earlier_dump_whole(tmp_path, monkeypatch):
    onnx.save(harmless_gather(), tmp_path / "gather.onnx")
    monkeypatch.chdir(tmp_path)
    assert main(["-q", "run", "gather.onnx", "--set", "output.report=null"]) == Exit.OK
    dump = tmp_path / "tvm_probe_out" / "gather" / "dump"
    files = {p.relative_to(dump): p.read_bytes() for p in dump.rglob("*") if p.is_file()}

    onnx.save(crashing_gather(), tmp_path / "gather.onnx")  # the same output folder, overwrite: true
    crashed = tvm_probe("run", "gather.onnx", cwd=tmp_path)
    assert (crashed.returncode, crashed.stderr) == (Exit.TVM_FAILED, VERDICT)
    assert {p.relative_to(dump): p.read_bytes() for p in dump.rglob("*") if p.is_file()} == files
    assert load_dump(dump).get("gather_node").shape == (3, 8)
    assert leftovers(tmp_path) == []


def test_an_error_passes_through_the_watcher_unchanged(tmp_path):
    unwatched = tvm_probe("run", "missing.onnx", cwd=tmp_path, watch=False)
    watched = tvm_probe("run", "missing.onnx", cwd=tmp_path)
    assert unwatched.returncode == Exit.BAD_INPUT and unwatched.stderr.startswith("tvm-probe: error: ")
    assert (watched.returncode, watched.stdout, watched.stderr) == \
        (unwatched.returncode, unwatched.stdout, unwatched.stderr)


@pytest.fixture(scope="module", params=["default", "fused"])
def crashing_probe(request):
    """A probe of the crashing model: built here (safe), never run here."""
    return request.param, Probe.from_onnx(crashing_gather(), pipeline=request.param)


def test_run_watched_raises_kernel_crash_with_the_kernel_its_call_and_source_ops(crashing_probe):
    pipeline, probe = crashing_probe
    with pytest.raises(KernelCrash) as raised:
        run_watched(probe.run, INPUTS)
    crash = raised.value
    assert (crash.kernel, crash.call) == CRASHING_CALL[pipeline]
    assert (crash.signal, crash.source_ops, crash.keys, crash.function) == \
        ("SIGSEGV", "source op 'gather_node' (Gather)", ("g",), "main")
    assert str(crash) == (f"TVM's kernel 'take1' (source op 'gather_node' (Gather)) crashed the process with "
                          f"SIGSEGV at kernel call #{crash.call}")
    failure = crash.failure
    assert (failure.stage, failure.kernels, failure.sites, failure.keys) == \
        ("runtime-crash", ("take1",), (crash.call,), ("g",))


def test_run_watched_returns_what_the_child_returned_or_raises_what_it_raised():
    probe = Probe.from_onnx(harmless_gather())
    outputs = run_watched(probe.run, INPUTS)
    assert list(outputs) == ["y"] and np.array_equal(outputs["y"], probe.run(INPUTS)["y"])
    with pytest.raises(InputError, match="'x'"):
        run_watched(probe.run, {"x": np.zeros((2, 2), np.float32)})


def test_a_process_killed_outside_any_kernel_is_said_so():
    with pytest.raises(KernelCrash) as raised:
        run_watched(lambda: os.kill(os.getpid(), signal.SIGKILL))
    crash = raised.value
    assert (crash.kernel, crash.call, crash.signal) == (None, None, "SIGKILL")
    assert str(crash).startswith("the process was killed with SIGKILL (what the system's out-of-memory killer sends) "
                                 "outside the model's kernel calls")
