"""Remote devices over TVM RPC (issue 15): real `tvm-probe serve` servers and a real TVM tracker
started on this machine, real TVM RPC, the CPU as the device.

Remote runs execute the same executable with the same kernels as local ones, so their values and
dumps must be byte-identical.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from support.models import chained_matmuls
from tvm_probe import Probe, TVMRunError, demo
from tvm_probe.core.errors import ProbeError
from tvm_probe.capture.remote import RemoteError, parse_remote
from tvm_probe.tools.split import run_pipeline, split

KEY = "tvm-probe-test"
READY_S = 60  # a server is up once TVM is imported and the instrument loaded


def _die_with_parent() -> None:
    """In the child: be killed when the test process dies (Linux), so a killed pytest leaves no server."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Process:
    """A Python command started in its own process group (so that it and its children can be
    ended together), killed with the test process too."""

    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True, start_new_session=True, preexec_fn=_die_with_parent)

    def kill(self, sig=signal.SIGKILL) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except ProcessLookupError:
            pass
        self.proc.wait(30)


class Server(Process):
    """``tvm-probe serve`` on a free port of 127.0.0.1; ``remote`` is how a probe reaches it."""

    def __init__(self, *args: str):
        super().__init__("-m", "tvm_probe.app.cli", "serve", "--host", "127.0.0.1", "--port", "0", *args)
        self.line = _first_line(self.proc, "tvm-probe serve")
        self.port = int(self.line.split("127.0.0.1:")[1].split(",")[0].split()[0])
        self.remote = {"host": "127.0.0.1", "port": self.port}


def _first_line(proc, what: str) -> str:
    """The first line ``proc`` prints (its ready line), or a failure after READY_S."""
    timer = threading.Timer(READY_S, proc.kill)
    timer.start()
    try:
        line = proc.stdout.readline()
    finally:
        timer.cancel()
    assert line, f"{what} did not start (exit status {proc.poll()})"
    return line


def _wait_listening(port: int, process: Process) -> None:
    """Until something listens on ``port`` (the process started by then)."""
    deadline = time.time() + READY_S
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.time() < deadline and process.proc.poll() is None, "the process did not start listening"
            time.sleep(0.2)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def server():
    srv = Server()
    yield srv
    srv.kill(signal.SIGTERM)


@pytest.fixture(scope="module")
def bert1():
    """The demo BERT with one layer, compiled once (fused pipeline) and run here."""
    model = demo.tiny_bert(num_layers=1)
    inputs = demo.demo_inputs(model)
    local = Probe.from_onnx(model, pipeline="fused")
    local.run(inputs)
    return model, inputs, local


@pytest.fixture(scope="module")
def remote_probe(bert1, server):
    """The same executable on the server (uploaded, not compiled again), run once."""
    _, inputs, local = bert1
    probe = Probe(local.imported, local.built, local.kernel_map, remote=server.remote)
    probe.run(inputs)
    return probe


# -- values and dumps ---------------------------------------------------------------------------
def test_remote_values_equal_local_ones_byte_for_byte(bert1, remote_probe, server):
    _, _, local = bert1
    assert remote_probe.remote == f"127.0.0.1:{server.port}" and remote_probe.instrument == "native"
    served = dict(zip(local.sources["tensor"], local.sources["served"]))
    checked = 0
    for key, how in served.items():
        if how in ("unavailable", "unknown"):
            continue
        a, b = local.get(key), remote_probe.get(key)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), key
        checked += 1
    assert checked > 50 and "recomputed" in served.values(), "fused-away values are recomputed remotely too"
    assert remote_probe.nodes["time_us"].iloc[remote_probe.num_input_nodes:].notna().all(), "every kernel timed"


def test_a_remote_dump_equals_a_local_one(bert1, remote_probe, tmp_path):
    _, inputs, local = bert1
    local.dump(tmp_path / "local", timings=False)
    remote_probe.dump(tmp_path / "remote", timings=False)
    remote_probe.run(inputs, stream_to=tmp_path / "streamed", timings=False)
    expected = tree(tmp_path / "local")
    assert tree(tmp_path / "remote") == expected
    assert tree(tmp_path / "streamed") == expected


def test_a_selective_remote_capture_copies_only_what_it_needs(bert1, remote_probe):
    _, inputs, local = bert1
    name = "layer_._0/attention/self/Softmax"
    remote_probe.run(inputs, capture=[name])
    assert remote_probe.get(name).tobytes() == local.get(name).tobytes()
    assert 0 < remote_probe._capture.copied_bytes < local._capture.copied_bytes


def test_untracked_arguments_come_back_from_the_server_like_the_python_instrument_takes_them(bert1, server):
    """No demo kernel has an untracked argument, so one is declared untracked by hand: the
    server keeps a copy taken before the call, and the run brings it back."""
    from test_native_capture import _site_changed

    from tvm_probe.capture.executor import CapturePlan, DebugExecutor
    from tvm_probe.kernel_map import ArgKind, ArgSource

    model, inputs, local = bert1
    site = next(s for s in local.kernel_map.sites if not s.is_view and s.args)
    km = _site_changed(local, args=[ArgSource(ArgKind.UNTRACKED)] + list(site.args[1:]))
    plan = CapturePlan(outputs=frozenset(), untracked_inputs=frozenset({site.index}))
    arrays = [inputs[s.name] for s in local.inputs]
    remote = DebugExecutor(local.built, km, remote=server.remote).run(arrays, plan)
    python = DebugExecutor(local.built, km, instrument="python").run(arrays, plan)
    assert remote.untracked_inputs.keys() == python.untracked_inputs.keys() == {site.index}
    a, b = remote.untracked_inputs[site.index][0], python.untracked_inputs[site.index][0]
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def test_a_python_instrument_is_refused_for_a_remote_device_before_connecting(bert1, monkeypatch):
    from tvm_probe.capture.executor import INSTRUMENT_ENV

    _, _, local = bert1
    monkeypatch.setenv(INSTRUMENT_ENV, "python")
    with pytest.raises(ProbeError) as err:  # no server at this address: it was not contacted
        Probe(local.imported, local.built, local.kernel_map, remote={"host": "127.0.0.1", "port": free_port()})
    assert str(err.value) == ("a Python instrument cannot run on a remote device (TVM RPC cannot call back into "
                              f"this process): unset {INSTRUMENT_ENV} to use the native one, loaded by the server")


# -- failures -----------------------------------------------------------------------------------
def test_a_wrong_address_fails_in_one_line_before_compiling(bert1):
    model, _, _ = bert1
    port = free_port()
    t0 = time.perf_counter()
    with pytest.raises(RemoteError) as err:
        Probe.from_onnx(model, remote={"host": "127.0.0.1", "port": port})
    assert time.perf_counter() - t0 < 5, "connected before the compile"
    message = str(err.value)
    assert message.startswith(f"cannot connect to the RPC server at 127.0.0.1:{port} (")
    assert message.endswith("is `tvm-probe serve` running there?") and "\n" not in message


@pytest.mark.parametrize("value, message", [
    ({"host": "h"}, "remote.port: must be a port number (1-65535), got None"),
    ({"host": "h", "port": 1, "tracker": "h:2"},
     "remote: give {host: HOST, port: PORT} or {tracker: 'HOST:PORT', key: KEY}"),
    ({"tracker": "h", "key": "k"}, "remote.tracker: must be 'HOST:PORT', got 'h'"),
    ("h:1", "remote: must be a mapping, {host: HOST, port: PORT} or {tracker: 'HOST:PORT', key: KEY}, got str"),
])
def test_a_bad_remote_is_refused_with_the_forms(value, message):
    with pytest.raises(ProbeError) as err:
        parse_remote(value)
    assert str(err.value) == message


@pytest.mark.slow
def test_a_stock_tvm_server_is_named_as_lacking_the_instrument(bert1):
    _, _, local = bert1
    port = free_port()
    stock = Process("-m", "tvm.exec.rpc_server", "--host", "127.0.0.1", "--port", str(port), "--port-end",
                    str(port + 1))
    try:
        _wait_listening(port, stock)
        with pytest.raises(RemoteError) as err:
            Probe(local.imported, local.built, local.kernel_map, remote={"host": "127.0.0.1", "port": port})
    finally:
        stock.kill()
    assert str(err.value) == (
        f"the RPC server at 127.0.0.1:{port} has no tvm_probe.capture.open: start it with `tvm-probe serve` (or "
        "TVM's rpc_server with --load-library and tvm_probe's native instrument library), from the same tvm_probe "
        "version")


@pytest.mark.parametrize("args, message", [
    (["--tracker", "127.0.0.1:1"], "--tracker needs --key: the device key clients ask the tracker for"),
    (["--tracker", "nowhere"], "--tracker must be HOST:PORT, got 'nowhere'"),
])
def test_serve_refuses_a_bad_tracker_in_one_line(args, message, capsys):
    from tvm_probe.app.cli import main

    assert main(["serve", "--port", "0", *args]) == 2
    assert capsys.readouterr().err == f"tvm-probe: error: {message}\n"


@pytest.mark.slow
def test_a_server_that_dies_mid_run_gives_one_line_and_no_dump(tmp_path):
    model, inputs = chained_matmuls(layers=8, n=768)
    srv = Server()
    try:
        probe = Probe.from_onnx(model, remote=srv.remote)
        t0 = time.perf_counter()
        probe.run(inputs)
        full = time.perf_counter() - t0
        first = probe.get("mm0")
        killer = threading.Timer(full / 3, srv.kill)
        other = {"x": inputs["x"] + 1}
        killer.start()
        t0 = time.perf_counter()
        with pytest.raises(TVMRunError) as err:
            probe.run(other, stream_to=tmp_path / "dump")
        stopped = time.perf_counter() - t0
        killer.join()
    finally:
        srv.kill()
    assert stopped < full, "the run stopped when the server died"
    message = str(err.value)
    assert isinstance(err.value, RemoteError) and "\n" not in message
    assert message.startswith(f"lost the remote device at 127.0.0.1:{srv.port} during the run (")
    assert message.endswith("nothing from this run is kept; the next run reconnects")
    assert list(tmp_path.iterdir()) == [], "no dump, not even a temporary one"
    # what the probe serves is still the last complete run, and says so
    np.testing.assert_array_equal(probe.last_inputs[0], inputs["x"])
    assert probe.get("mm0").tobytes() == first.tobytes()
    with pytest.raises(RemoteError) as again:
        probe.run(other)
    assert str(again.value).startswith(f"cannot connect to the RPC server at 127.0.0.1:{srv.port} (")


# -- configs -------------------------------------------------------------------------------------
def _config(tmp_path, remote: str) -> Path:
    path = tmp_path / "remote.yaml"
    path.write_text("model: {demo: {num_layers: 1}}\npipeline: fused\nreference: onnxruntime\n"
                    f"output: {{dump: dump}}\nremote: {remote}\n")
    return path


def test_a_config_with_remote_runs_there_and_dumps_here(server, tmp_path, capsys):
    from tvm_probe.app.cli import main

    status = main(["-q", "run", str(_config(tmp_path, f"{{host: 127.0.0.1, port: {server.port}}}"))])
    out = capsys.readouterr().out
    assert status == 0, out
    assert re.search(r"^all \d+ compared values within tolerance", out, re.M), out
    assert (tmp_path / "dump" / "_tvmdbg_device_CPU_0").is_dir()


def test_a_config_whose_remote_is_unreachable_fails_before_compiling(tmp_path, capsys):
    from tvm_probe.app.cli import main

    port = free_port()
    t0 = time.perf_counter()
    assert main(["-q", "run", str(_config(tmp_path, f"{{host: 127.0.0.1, port: {port}}}"))]) == 4
    assert time.perf_counter() - t0 < 10
    assert capsys.readouterr().err == (f"tvm-probe: TVM failed: cannot connect to the RPC server at 127.0.0.1:{port} "
                                       f"(Check failed: (sock.Connect(addr)) is false: Connect to 127.0.0.1:{port} "
                                       "failed): is `tvm-probe serve` running there?\n")


# -- tracker and pipelines ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tracked():
    """A TVM tracker and a `tvm-probe serve` registered with it under KEY."""
    pytest.importorskip("tornado", reason="TVM's RPC tracker needs tornado (pip install -e '.[test]')")
    port = free_port()
    # TVM's tracker in a process of its own (tvm.exec.rpc_tracker would start another one under it)
    tracker = Process("-c", "from tvm.rpc.tracker import PopenTrackerServerState as T; "
                            f"T('127.0.0.1', {port}, {port + 1}, silent=True).thread.join()")
    _wait_listening(port, tracker)
    srv = Server("--tracker", f"127.0.0.1:{port}", "--key", KEY)
    yield {"tracker": f"127.0.0.1:{port}", "key": KEY}, srv
    srv.kill(signal.SIGTERM)
    tracker.kill()


def _wait_registered(remote: dict) -> None:
    """The server registers with the tracker just after it says it listens."""
    from tvm import rpc

    host, port = remote["tracker"].rsplit(":", 1)
    deadline = time.time() + READY_S
    while True:
        tracker = rpc.connect_tracker(host, int(port))
        keys = [s["key"] for s in tracker.summary()["server_info"]]
        tracker.close()
        if f"server:{KEY}" in keys:
            return
        assert time.time() < deadline, f"no server registered with the tracker: {keys}"
        time.sleep(0.2)


def test_a_device_found_through_a_tracker_gives_the_same_values(bert1, tracked):
    _, inputs, local = bert1
    remote, srv = tracked
    assert srv.line.strip().endswith(f"registered as {KEY!r} with the tracker at {remote['tracker']} (Ctrl-C to stop)")
    _wait_registered(remote)
    probe = Probe(local.imported, local.built, local.kernel_map, remote=remote)
    out = probe.run(inputs)
    assert probe.remote == f"key {KEY!r} at tracker {remote['tracker']}"
    assert out["logits"].tobytes() == local.run(inputs)["logits"].tobytes()
    name = "layer_._0/output/LayerNorm/batchnorm/add_1:0"
    assert probe.get(name).tobytes() == local.get(name).tobytes()
    with pytest.raises(RemoteError) as err:
        Probe(local.imported, local.built, local.kernel_map, remote={**remote, "key": "no-such-device"})
    assert str(err.value) == (f"the RPC tracker at {remote['tracker']} has no server with key 'no-such-device' "
                              f"(keys: {KEY}): start one with `tvm-probe serve --tracker {remote['tracker']} "
                              "--key no-such-device`")


def test_run_pipeline_runs_stages_on_two_devices_and_reports_each_cut(server, tracked):
    remote, _ = tracked
    _wait_registered(remote)
    model = demo.tiny_bert(num_layers=2)
    inputs = demo.demo_inputs(model)
    plan = split(model, ["layer_._0/output/LayerNorm"])
    here = run_pipeline(plan, inputs, capture="all")
    there = run_pipeline(plan, inputs, devices=[server.remote, remote], capture="all")
    assert there["logits"].tobytes() == here["logits"].tobytes()
    name = "layer_._1/attention/self/Softmax"  # each stage is a probe, wherever it runs
    assert plan.stages[1].probe_on(remote).get(name).tobytes() == plan.stages[1].probe.get(name).tobytes()
    table = plan.cut_table()
    assert len(table) == 1
    row = table.iloc[0]
    assert (row.source, row.target) == (f"127.0.0.1:{server.port}", f"key {KEY!r} at tracker {remote['tracker']}")
    crossing = int(plan.table()["bytes"].sum())
    assert row.bytes_out == crossing and row.bytes_in == crossing  # the hidden state and the mask
    assert row.out_us > 0 and row.in_us > 0 and row.total_us == row.out_us + row.in_us
    with pytest.raises(ProbeError, match=r"devices: give one per stage \(2\), got 1"):
        run_pipeline(plan, inputs, devices=[None])
