"""The native capture instrument (issue 16): same captures as the Python one, cheaper runs.

Every test runs the real VM on real compiled models; the Python instrument is the reference.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tvm_probe.core.schema import PIPELINES

from tvm_probe import Probe, ProbeError
from tvm_probe.capture.executor import INSTRUMENT_ENV, CapturePlan, DebugExecutor
from tvm_probe.core.errors import TVMBehaviourChanged
from tvm_probe.kernel_map import ArgKind, ArgSource, KernelMap
from support.native_tools import HAS_TOOLS
from support.processes import run_signalling_itself

needs_native = pytest.mark.skipif(not HAS_TOOLS,
                                  reason="no C++ compiler or ninja: only the Python instrument exists")
WANTED = "layer_._0/attention/self/MatMul"  # fused away under "fused": needs its kernel's inputs


def twin(probe: Probe, instrument: str, monkeypatch) -> Probe:
    """A probe on the same compiled executable whose executor uses ``instrument``."""
    monkeypatch.setenv(INSTRUMENT_ENV, instrument)
    other = Probe(probe.imported, probe.built, probe.kernel_map)
    monkeypatch.delenv(INSTRUMENT_ENV)
    return other


def tree(root) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module", params=PIPELINES)
def pair(request, bert_model):
    """The demo BERT compiled once per pipeline, with a native and a Python probe on it."""
    mp = pytest.MonkeyPatch()
    native = Probe.from_onnx(bert_model, pipeline=request.param)
    python = twin(native, "python", mp)
    native = twin(native, "native" if HAS_TOOLS else "auto", mp)
    yield native, python
    mp.undo()


# -- which instrument runs ----------------------------------------------------------------------
def test_the_native_instrument_runs_where_it_can_be_built(pair, bert_inputs):
    native, python = pair
    assert native._executor.instrument == ("native" if HAS_TOOLS else "python")
    assert python._executor.instrument == "python" and python._executor.fallback_reason is None
    native.run(bert_inputs)
    python.run(bert_inputs)
    assert native._capture.instrument == native._executor.instrument
    assert python._capture.instrument == "python"


def test_an_unknown_instrument_is_refused_with_the_choices(fused_bert_probe, monkeypatch):
    monkeypatch.setenv(INSTRUMENT_ENV, "fast")
    with pytest.raises(ProbeError) as err:
        DebugExecutor(fused_bert_probe.built, fused_bert_probe.kernel_map)
    assert str(err.value) == f"instrument must be one of auto, native, python, got 'fast' (from {INSTRUMENT_ENV})"


def test_without_a_compiler_the_python_instrument_runs_and_says_why(tmp_path):
    """A fresh cache and no compiler on PATH: the build is not possible, the run still works."""
    script = textwrap.dedent("""
        from tvm_probe import Probe, ProbeError, demo
        from tvm_probe.capture import DebugExecutor
        model = demo.tiny_bert()
        probe = Probe.from_onnx(model, pipeline="fused")
        probe.run(demo.demo_inputs(model))
        print(probe._capture.instrument, "|", probe._executor.fallback_reason)
        try:
            DebugExecutor(probe.built, probe.kernel_map, instrument="native")
        except ProbeError as err:
            print(err)
    """)
    env = dict(os.environ, PATH=str(tmp_path), CXX=str(tmp_path / "no-such-c++"),
               TVM_PROBE_CACHE_DIR=str(tmp_path / "cache"))
    env.pop(INSTRUMENT_ENV, None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    missing = f"{tmp_path / 'no-such-c++'} and ninja not found on PATH"
    assert out.stdout.splitlines() == [
        f"python | {missing}",
        f"the native instrument is unavailable: {missing}; set {INSTRUMENT_ENV}=auto or python to use the "
        "Python instrument"]
    assert not (tmp_path / "cache").exists()


def test_a_failed_build_falls_back_once_and_leaves_no_library(tmp_path):
    """A compiler that fails (``false``): the Python instrument runs, the reason is the build's,
    and no half-built library is left where the next process would load it."""
    if shutil.which("ninja") is None or shutil.which("false") is None:
        pytest.skip("needs ninja and false")
    script = textwrap.dedent("""
        import logging
        logging.basicConfig(level=logging.INFO, format="%(message)s")
        from tvm_probe import Probe, demo
        from tvm_probe.capture import DebugExecutor
        model = demo.tiny_bert()
        probe = Probe.from_onnx(model, pipeline="fused")
        again = DebugExecutor(probe.built, probe.kernel_map)
        print(probe._executor.instrument, again.instrument, "|", probe._executor.fallback_reason)
    """)
    env = dict(os.environ, CXX=shutil.which("false"), TVM_PROBE_CACHE_DIR=str(tmp_path / "cache"))
    env.pop(INSTRUMENT_ENV, None)
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ("python python | building or loading instrument.cc failed: "
                                  "ninja exited with status 1")
    assert out.stderr.count("building tvm_probe's native instrument") == 1, "tried once per process"
    assert list((tmp_path / "cache").rglob("*.so")) == []


# -- the same capture from both instruments -------------------------------------------------------
def test_both_instruments_write_byte_identical_dumps(pair, bert_inputs, tmp_path):
    native, python = pair
    for name, probe in (("native", native), ("python", python)):
        probe.run(bert_inputs)
        probe.dump(tmp_path / name, timings=False)
    native_files, python_files = tree(tmp_path / "native"), tree(tmp_path / "python")
    assert native_files.keys() == python_files.keys()
    assert [f for f in native_files if native_files[f] != python_files[f]] == []


def test_both_instruments_stream_byte_identical_dumps(pair, bert_inputs, tmp_path):
    native, python = pair
    for name, probe in (("native", native), ("python", python)):
        probe.run(bert_inputs, stream_to=tmp_path / name, timings=False)
    assert tree(tmp_path / "native") == tree(tmp_path / "python")


def test_both_instruments_time_the_same_calls(pair, bert_inputs):
    native, python = pair
    native.run(bert_inputs)
    python.run(bert_inputs)
    a, b = native._capture, python._capture
    assert a.time_us.keys() == b.time_us.keys() == a.start_us.keys()
    assert all(t >= 0 for t in a.time_us.values())
    starts = [a.start_us[i] for i in sorted(a.start_us)]
    assert starts == sorted(starts), "calls start in order"


# -- native behaviour -----------------------------------------------------------------------------
@needs_native
def test_selective_capture_copies_only_what_the_value_needs(pair, bert_inputs, bert_reference):
    native, _ = pair
    native.run(bert_inputs, capture=[WANTED])
    key = native.resolve(WANTED)
    km = native.kernel_map
    site = km.sites[km.site_of(key)]
    needed = {a.node for a in site.args if a.kind is ArgKind.NODE} if native.served(WANTED) == "recomputed" \
        else {site.index}
    capture = native._capture
    assert set(capture.outputs) == needed
    assert capture.copied_bytes == sum(o.nbytes for i in needed for o in capture.outputs[i])
    assert len(capture.time_us) == len(km.sites), "every call is still timed"
    np.testing.assert_allclose(native.get(WANTED), bert_reference[key], atol=1e-4)


@needs_native
def test_full_capture_reports_the_bytes_it_copied(pair, bert_inputs):
    native, _ = pair
    native.run(bert_inputs)
    capture = native._capture
    assert capture.copied_bytes == sum(a.nbytes for outs in capture.outputs.values() for a in outs) > 0


@needs_native
def test_a_later_run_never_overwrites_arrays_still_held(pair, bert_inputs):
    """Arenas are reused; one whose arrays someone still holds must not be."""
    native, _ = pair
    other = {k: (v + 1) % 100 if k == "input_ids" else v for k, v in bert_inputs.items()}
    last = native.num_input_nodes + max(s.index for s in native.kernel_map.sites if not s.is_view)
    native.run(bert_inputs)
    held = native.get_node_output(last)  # the logits: they depend on every input id
    kept = held.copy()
    for inputs in (other, other, bert_inputs, other):
        native.run(inputs)
    np.testing.assert_array_equal(held, kept)
    assert not np.array_equal(native.get_node_output(last), kept)


def _site_changed(probe, **changes) -> KernelMap:
    """The probe's call sites with the first kernel site (not a view) changed."""
    sites = list(probe.kernel_map.sites)
    first = next(s for s in sites if not s.is_view)
    sites[first.index] = dataclasses.replace(first, **changes)
    return KernelMap(sites=sites)


@needs_native
def test_a_kernel_output_of_another_shape_stops_the_run(fused_bert_probe, bert_inputs):
    probe = fused_bert_probe
    first = next(s for s in probe.kernel_map.sites if not s.is_view)
    wrong = [tuple(d + 1 for d in first.out_shapes[0])] + first.out_shapes[1:]
    executor = DebugExecutor(probe.built, _site_changed(probe, out_shapes=wrong), instrument="native")
    with pytest.raises(TVMBehaviourChanged) as err:
        executor.run([bert_inputs[s.name] for s in probe.inputs], CapturePlan())
    assert str(err.value).startswith(f"output 0 of call site {first.index} ({first.symbol}) does not have the "
                                     "shape and dtype compiled for it")


@pytest.mark.parametrize("instrument", ["native", "python"])
def test_calls_that_match_no_call_site_are_reported(fused_bert_probe, bert_inputs, instrument):
    if instrument == "native" and not HAS_TOOLS:
        pytest.skip("no C++ compiler or ninja")
    probe = fused_bert_probe
    first = next(s for s in probe.kernel_map.sites if not s.is_view)
    executor = DebugExecutor(probe.built, _site_changed(probe, symbol="renamed_kernel"), instrument=instrument)
    with pytest.raises(TVMBehaviourChanged) as err:  # copy nothing: the matching alone is tested
        executor.run([bert_inputs[s.name] for s in probe.inputs], CapturePlan(outputs=frozenset()))
    assert f"unexpected: ['{first.symbol}" in str(err.value)
    assert "never called: ['renamed_kernel#" in str(err.value)


@needs_native
def test_untracked_arguments_are_copied_before_the_call_like_the_python_instrument(fused_bert_probe, bert_inputs):
    """No demo kernel has an untracked argument, so one is declared untracked by hand: both
    instruments must then hand over the same tensor, taken before the call."""
    probe = fused_bert_probe
    site = next(s for s in probe.kernel_map.sites if not s.is_view and s.args)
    args = [ArgSource(ArgKind.UNTRACKED)] + list(site.args[1:])
    km = _site_changed(probe, args=args)
    plan = CapturePlan(outputs=frozenset(), untracked_inputs=frozenset({site.index}))
    arrays = [bert_inputs[s.name] for s in probe.inputs]
    native = DebugExecutor(probe.built, km, instrument="native").run(arrays, plan)
    python = DebugExecutor(probe.built, km, instrument="python").run(arrays, plan)
    assert native.untracked_inputs.keys() == python.untracked_inputs.keys() == {site.index}
    a, b = native.untracked_inputs[site.index][0], python.untracked_inputs[site.index][0]
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@needs_native
def test_a_vm_can_be_instrumented_by_the_registered_factory(fused_bert_probe, bert_inputs):
    """``set_instrument("tvm_probe.capture.instrument", session)``: how a VM in another process
    (an RPC server that loaded the library) is instrumented; the outputs land in an arena of
    the session's own."""
    import tvm

    from tvm_probe.capture import native

    probe = fused_bert_probe
    site = next(s for s in probe.kernel_map.sites if not s.is_view)
    slots, end = native.layout(list(zip(site.out_shapes, site.out_dtypes)))
    sites = [native.NativeSite(s.symbol, s.is_view, s.num_inputs, native.COPY if s is site else 0,
                               outputs=tuple(slots) if s is site else tuple(
                                   native.Slot(-1, 0, d, shape) for shape, d in zip(s.out_shapes, s.out_dtypes)))
             for s in probe.kernel_map.sites]
    session = native.load().open(native.encode_plan(sites, end))
    vm = tvm.relax.VirtualMachine(probe.built.executable, tvm.cpu())
    vm.module["set_instrument"](native.FACTORY, session.id)
    session.begin()
    vm["main"](*[tvm.runtime.tensor(bert_inputs[s.name]) for s in probe.inputs])
    assert session.stats[native.CALLED] == len(sites) and session.stats[native.UNEXPECTED] == 0
    assert not np.isnan(session.times).any()
    session.end()
    probe.run(bert_inputs)
    expected = probe._capture.outputs[site.index][0]
    arena = session.arena()
    got = arena[slots[0].offset: slots[0].offset + slots[0].nbytes].view(expected.dtype)
    np.testing.assert_array_equal(got.reshape(expected.shape), expected)
    # after end(), a run nobody began leaves the session alone (the VM keeps its instrument)
    before, kept = session.times.copy(), arena.copy()
    vm["main"](*[tvm.runtime.tensor(bert_inputs[s.name]) for s in probe.inputs])
    np.testing.assert_array_equal(session.times, before)
    np.testing.assert_array_equal(arena, kept)


@needs_native
def test_ctrl_c_stops_a_long_native_run_in_the_middle():
    """The native instrument lets Python's SIGINT handler run between kernels, so Ctrl-C does not
    wait for the end of a long run, and arrives as a KeyboardInterrupt.  (In a process of its own:
    support.processes.SIGNALS_ITSELF.)"""
    run = run_signalling_itself(textwrap.dedent("""
        import json, os, threading, time
        from support.models import chained_matmuls
        from tvm_probe import Probe
        model, inputs = chained_matmuls()
        probe = Probe.from_onnx(model, pipeline="fused")
        found = {"instrument": probe._executor.instrument}
        t0 = time.perf_counter()
        probe.run(inputs)
        full = time.perf_counter() - t0
        timer = threading.Timer(full / 4, lambda: os.kill(os.getpid(), signal.SIGINT))
        t0 = time.perf_counter()
        timer.start()
        try:
            probe.run(inputs)
            found["interrupted"] = False
        except KeyboardInterrupt:
            found["interrupted"] = True
        found["stopped"], found["full"] = time.perf_counter() - t0, full
        timer.join()
        probe.run(inputs)  # the probe is still usable (runs after the first go through native hooks)
        found["after"] = probe._capture.instrument
        print(json.dumps(found))
    """))
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.splitlines()[-1])
    assert found["instrument"] == "native" and found["interrupted"], found
    assert found["stopped"] < found["full"] * 0.8, found
    assert found["after"] in ("native", "kernel hook"), found


