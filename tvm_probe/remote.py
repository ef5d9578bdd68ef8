"""Remote devices over TVM RPC: a server tvm_probe can instrument, and a probe's end of it.

On the device (a board, a GPU machine, or another process on this one)::

    tvm-probe serve --port 9190                        # or: --tracker HOST:PORT --key K

On the host::

    probe = Probe.from_onnx(model, target=..., remote={"host": "board", "port": 9190})
    probe = Probe.from_onnx(model, target=..., remote={"tracker": "host:9190", "key": "K"})
    probe.run(inputs); probe.get(...); probe.dump(...)          # unchanged

How it works.  A Python instrument cannot cross TVM RPC (RPC has no calls from the server back
to the client), but the Relax VM's ``set_instrument`` also takes the *name* of a global factory
function, looked up in the VM's own process.  ``tvm-probe serve`` is a TVM RPC server whose
sessions load tvm_probe's native instrument (:mod:`tvm_probe.native`), which registers that
factory (``tvm_probe.capture.instrument``) and the functions a client drives a capture session
with.  The probe then:

1. connects (directly, or through a tracker) — before compiling, so a wrong address fails fast;
2. exports the executable it compiled (``export_library``), uploads it and loads it in a VM on
   the remote device (the same executable, so the same call sites);
3. per run: opens a capture session there for the run's :class:`~tvm_probe.capture.CapturePlan`,
   instruments the VM with it by name, sends the inputs, runs, and downloads the outputs, the
   per-call times and the arena holding every copied kernel output (one transfer);
4. recomputes values kept inside fused kernels there too: each cut module is compiled here,
   uploaded and run on the remote device (:class:`RemoteRecomputer`).

A run either brings back everything it copied or raises :class:`RemoteError`: when the server
dies or the connection drops, the run fails in one line, nothing of it is kept (a dump being
streamed is not left behind), and the next run reconnects.

TVM's stock ``python -m tvm.exec.rpc_server --load-library <instrument .so>`` (the library
``tvm_probe.native.library_path()`` names, built for the server's machine) serves the same
functions: the instrument needs only TVM's runtime on the device.

Direct clients are served at the same time, each in a process of its own; with a tracker, TVM's
own loop serves one client at a time, as the tracker hands the server out.

Limits: the executable is linked by this machine's default compiler (``export_library``), so the
device must run code this machine can link (the same architecture: cross-compiling is not
supported yet); captures need static shapes (the native instrument); kernel times are measured
on the device by its own clock (device sync around each kernel on GPUs, see
:mod:`tvm_probe.capture`).
"""
from __future__ import annotations

import logging
import os
import signal
import socket
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import ProbeError, TVMRunError, one_line
from .recompute import Recomputer, _cut_name, wanted_arrays

log = logging.getLogger(__name__)

KEYS = ("host", "port", "tracker", "key")
FORMS = "{host: HOST, port: PORT} or {tracker: 'HOST:PORT', key: KEY}"
_CONNECT_TIMEOUT_S = 10.0  # to reach a tracker (TVM retries for 60 s), or for a client's handshake


class RemoteError(TVMRunError):
    """A remote device cannot be reached, lacks tvm_probe's instrument, or was lost in a run."""


# ------------------------------------------------------------------------------------- where
@dataclass(frozen=True)
class RemoteSpec:
    """Where a remote device is: a server (``host``, ``port``) or a tracker and a device key.

    Attributes:
        host, port: the RPC server (``tvm-probe serve --port``).
        tracker: ``(host, port)`` of a TVM RPC tracker; then ``key`` names the device kind.
        key: the server key (with a tracker: required; without one: the key the server was
            started with, usually empty).
    """

    host: str | None = None
    port: int | None = None
    tracker: tuple[str, int] | None = None
    key: str = ""

    def describe(self) -> str:
        """``host:port``, or ``key 'K' at tracker host:port``."""
        if self.tracker is not None:
            return f"key {self.key!r} at tracker {self.tracker[0]}:{self.tracker[1]}"
        return f"{self.host}:{self.port}"


def remote_problems(value) -> list[tuple[tuple, str]]:
    """What is wrong with a remote description (``(key path, message)`` each; empty when it is
    valid); :func:`parse_remote` and the YAML ``remote:`` key share this one check."""
    if not isinstance(value, dict):
        return [((), f"must be a mapping, {FORMS}, got {type(value).__name__}")]
    problems = [((k,), f"unknown key; valid keys here: {', '.join(KEYS)}") for k in value if k not in KEYS]
    if ("tracker" in value) == ("host" in value or "port" in value):
        problems.append(((), f"give {FORMS}"))
        return problems
    if "tracker" in value:
        if _address(value["tracker"]) is None:
            problems.append((("tracker",), f"must be 'HOST:PORT', got {value['tracker']!r}"))
        if not isinstance(value.get("key"), str) or not value.get("key"):
            problems.append((("key",), f"must name the device key the servers registered with, got "
                                       f"{value.get('key')!r}"))
        return problems
    if not isinstance(value.get("host"), str) or not value.get("host"):
        problems.append((("host",), f"must be a host name or address, got {value.get('host')!r}"))
    port = value.get("port")
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        problems.append((("port",), f"must be a port number (1-65535), got {port!r}"))
    if not isinstance(value.get("key", ""), str):
        problems.append((("key",), f"must be a string, got {value.get('key')!r}"))
    return problems


def parse_remote(value) -> RemoteSpec:
    """A :class:`RemoteSpec` from a dict (see :data:`FORMS`) or a RemoteSpec; ProbeError when
    it is not valid, with every problem."""
    if isinstance(value, RemoteSpec):
        return value
    problems = remote_problems(value)
    if problems:
        shown = "; ".join(f"{'.'.join(('remote',) + keys)}: {text}" for keys, text in problems)
        raise ProbeError(shown)
    if "tracker" in value:
        return RemoteSpec(tracker=_address(value["tracker"]), key=value["key"])
    return RemoteSpec(host=value["host"], port=value["port"], key=value.get("key", ""))


def _address(text) -> tuple[str, int] | None:
    """``(host, port)`` from ``'HOST:PORT'``; None when it is not one."""
    if not isinstance(text, str):
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port)


# ------------------------------------------------------------------------------------- connection
class Connection:
    """One TVM RPC session with a server that has tvm_probe's instrument.

    Args:
        spec: where (see :class:`RemoteSpec`).

    Raises:
        RemoteError: the server or tracker cannot be reached, the tracker has no server with
            the key, or the server lacks the instrument (a stock TVM server, another version).
    """

    def __init__(self, spec: RemoteSpec):
        self.spec = spec
        self.where = spec.describe()
        self.session = _tracker_session(spec) if spec.tracker is not None else _direct_session(spec)
        self._functions: dict[str, object] = {}
        self.function("tvm_probe.capture.open")  # fail now on a server without the instrument

    def function(self, name: str):
        """The server's global function ``name`` (cached)."""
        if name not in self._functions:
            try:
                self._functions[name] = self.session.get_function(name)
            except Exception as err:
                if not self.alive():
                    raise RemoteError(f"lost the connection to {self.where} ({one_line(err)})") from None
                raise RemoteError(
                    f"the RPC server at {self.where} has no {name}: start it with `tvm-probe serve` (or TVM's "
                    "rpc_server with --load-library and tvm_probe's native instrument library), from the same "
                    "tvm_probe version") from None
        return self._functions[name]

    def alive(self) -> bool:
        """True when the server still answers."""
        try:
            self.session.get_function("runtime.GetDeviceAttr")
            return True
        except Exception:
            return False

    def upload(self, executable, name: str):
        """``executable`` (a built Relax executable) exported here, uploaded, loaded there."""
        from .failures import native_log_to_logging

        with tempfile.TemporaryDirectory(prefix="tvm_probe_upload_") as tmp:
            path = Path(tmp) / name
            try:
                with native_log_to_logging():
                    executable.export_library(str(path))
            except Exception as err:
                raise RemoteError(f"cannot export the executable for {self.where}: {one_line(err)} (the "
                                  "remote device must run code this machine's compiler can link)") from None
            try:
                self.session.upload(str(path))
                return self.session.load_module(name)
            except Exception as err:
                raise RemoteError(f"cannot load the executable on {self.where}: {one_line(err)}") from None

    def device(self, target):
        """The remote device (index 0) that code built for ``target`` runs on; RemoteError
        when the server has none."""
        from .build import device_for

        local = device_for(target)
        try:
            remote = self.session.device(local.dlpack_device_type(), local.index)
            exists = remote.exist
        except Exception as err:
            raise RemoteError(f"cannot query the devices of {self.where}: {one_line(err)}") from None
        if not exists:
            raise RemoteError(f"the server at {self.where} has no {_kind(target)} device {local.index}: give a "
                              "target it can run")
        return remote


def _kind(target) -> str:
    return {"llvm": "CPU", "c": "CPU"}.get(str(target.kind.name), str(target.kind.name).upper())


def _direct_session(spec: RemoteSpec):
    from tvm import rpc

    try:
        return rpc.connect(spec.host, spec.port, key=spec.key)
    except Exception as err:
        raise RemoteError(f"cannot connect to the RPC server at {spec.describe()} ({one_line(err)}): is "
                          "`tvm-probe serve` running there?") from None


def _tracker_session(spec: RemoteSpec):
    """A session with a free server of ``spec.key`` that the tracker hands out (waits while all
    such servers are busy; fails at once when the tracker knows none)."""
    from tvm import rpc

    host, port = spec.tracker
    try:
        socket.create_connection((host, port), timeout=_CONNECT_TIMEOUT_S).close()
        tracker = rpc.connect_tracker(host, port)
        servers = [s["key"].split(":", 1)[-1] for s in tracker.summary()["server_info"]]
    except Exception as err:
        raise RemoteError(f"cannot reach the RPC tracker at {host}:{port} ({one_line(err)})") from None
    if spec.key not in servers:
        known = ", ".join(sorted(set(servers))) or "none"
        raise RemoteError(f"the RPC tracker at {host}:{port} has no server with key {spec.key!r} (keys: "
                          f"{known}): start one with `tvm-probe serve --tracker {host}:{port} --key {spec.key}`")
    try:
        return tracker.request(spec.key, priority=1, session_timeout=0, max_retry=1)
    except Exception as err:
        raise RemoteError(f"the RPC tracker at {host}:{port} could not give a server with key {spec.key!r} "
                          f"({one_line(err)})") from None
    finally:
        tracker.close()


def connect(remote) -> Connection:
    """A :class:`Connection` from a spec, a dict (see :func:`parse_remote`) or a Connection."""
    return remote if isinstance(remote, Connection) else Connection(parse_remote(remote))


# ------------------------------------------------------------------------------------- capture
class RemoteLibrary:
    """The native instrument's functions on a server: what :class:`~tvm_probe.native.NativeLibrary`
    is in this process (``open`` gives sessions with the same interface)."""

    can_call_back = False  # no on_event callbacks: RPC cannot call the client

    def __init__(self, connection: Connection):
        self.connection = connection

    def open(self, plan: str) -> "RemoteSession":
        try:
            session_id = int(self.connection.function("tvm_probe.capture.open")(plan))
        except RemoteError:
            raise
        except Exception as err:
            raise RemoteError(f"the server at {self.connection.where} refused tvm_probe's capture plan "
                              f"({one_line(err)}): run the same tvm_probe version there") from None
        return RemoteSession(self.connection, session_id)


class RemoteSession:
    """A capture session in the server's process, driven over RPC.

    Same interface as :class:`~tvm_probe.native.NativeSession`; what a run wrote is downloaded
    by :meth:`end` (times, stats) and :meth:`arena` (the copied outputs), each in one transfer.
    """

    def __init__(self, connection: Connection, session_id: int):
        from . import native

        self._conn, self.id = connection, session_id
        self._factory = native.FACTORY
        self.times = np.full((2, 0), np.nan)
        self.stats = np.zeros(4, dtype=np.int64)

    def _call(self, name: str, *args):
        return self._conn.function(f"tvm_probe.capture.{name}")(self.id, *args)

    def instrument(self) -> tuple:
        """``(factory name, session id)``: what ``set_instrument`` is given by name."""
        return self._factory, self.id

    def begin(self, arena_address: int = 0, on_event=None) -> None:
        """Reset before a run; outputs go to the session's own arena on the server."""
        if arena_address or on_event is not None:
            raise ValueError("a remote session copies into its own arena and calls nothing back")
        self.times = np.full((2, 0), np.nan)
        self.stats = np.zeros(4, dtype=np.int64)
        self._call("begin", 0, None)

    def end(self) -> None:
        """After a run: stop the session and download its times and stats.  A server that is
        gone leaves them empty (NaN times, zero stats); the run's error says what happened."""
        try:
            self._call("end")
            self.times = self._call("times").numpy().reshape(2, -1)
            self.stats = self._call("stats").numpy()
        except Exception as err:  # the caller is already handling the run's own error
            log.debug("could not read the remote session back: %s", one_line(err))

    def unexpected(self) -> list[str]:
        """The first calls of the last run that matched no call site."""
        return [u for u in str(self._call("unexpected")).split("\n") if u]

    def error(self) -> str:
        """Why the instrument stopped the last run ("" when it did not)."""
        return str(self._call("error"))

    def arena(self) -> np.ndarray | None:
        """The arena of the last run, downloaded (one transfer); None when the plan copies nothing."""
        tensor = self._call("arena")
        if tensor is None:
            return None
        try:
            return tensor.numpy()
        finally:
            del tensor  # frees the server's reference: the arena can be reused by the next run

    def kept(self, site: int, position: int) -> np.ndarray | None:
        """Untracked input ``position`` of call site ``site`` in the last run, downloaded."""
        tensor = self._call("kept", site, position)
        return None if tensor is None else tensor.numpy()

    def close(self) -> None:
        """Forget the session on the server (nothing to do when the server is gone)."""
        if self.id is not None:
            try:
                self._call("close")
            except Exception:  # the server is gone: so is the session
                pass
            self.id = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class RemoteRuntime:
    """The executable on a remote device: connection, uploaded module, VM, and what is lost.

    :class:`~tvm_probe.capture.DebugExecutor` runs through this when a probe has ``remote=``.

    Args:
        built: the compiled model (:class:`~tvm_probe.build.BuiltModel`).
        remote: a :class:`Connection` (used as is) or anything :func:`connect` takes.
    """

    def __init__(self, built, remote):
        self._built = built
        self.connection = connect(remote)
        self.spec, self.where = self.connection.spec, self.connection.where
        self.generation = 0   # bumped by every (re)connection: remote objects of older ones are gone
        self.lost = False
        self._load()

    def _load(self) -> None:
        from tvm import relax

        self.device = self.connection.device(self._built.target)
        module = self.connection.upload(self._built.executable, "tvm_probe_model.so")
        try:
            self.vm = relax.VirtualMachine(module, self.device)
        except Exception as err:
            raise RemoteError(f"cannot start the VM on {self.where}: {one_line(err)}") from None
        self.library = RemoteLibrary(self.connection)
        self.generation += 1
        self.lost = False

    def reconnect(self) -> None:
        """A new session after the last one was lost: connect, upload, load again."""
        self.connection = Connection(self.spec)
        self._load()

    def to_device(self, array: np.ndarray):
        """``array`` sent to the remote device."""
        import tvm

        return tvm.runtime.tensor(array, self.device)

    def call(self, device_inputs) -> object:
        """Run ``main`` once; its outputs (remote tensors, or a tuple of them)."""
        return run_main(self.vm, device_inputs)

    def failure(self, err: BaseException) -> RemoteError | None:
        """The error for a run that raised ``err``, when the server is gone (then the next run
        reconnects); None when it still answers (the model itself failed)."""
        if self.connection.alive():
            return None
        self.lost = True
        return RemoteError(f"lost the remote device at {self.where} during the run ({one_line(err)}): nothing "
                           "from this run is kept; the next run reconnects")


def run_main(vm, device_inputs, name: str = "main") -> object:
    """``vm``'s function ``name`` on ``device_inputs``, the way a VM over RPC takes it (RPC
    carries no tuples: inputs are set, then outputs fetched one by one)."""
    vm.set_input(name, *device_inputs)
    vm.invoke_stateful(name)
    return vm.get_outputs(name)


# ------------------------------------------------------------------------------------- recompute
class RemoteRecomputer(Recomputer):
    """Recomputes values kept inside fused kernels on the remote device, where they were computed.

    The same cuts as :class:`~tvm_probe.recompute.Recomputer` (one executable holding every
    cut, compiled here for the probe's target), uploaded once per connection and run there on
    the call site's captured inputs.
    """

    def __init__(self, target, runtime: RemoteRuntime, groups=()):
        super().__init__(target, groups)
        self._runtime = runtime
        self._generation = runtime.generation

    def _run_cut(self, vm, group, feed: list[np.ndarray], wanted) -> dict:
        """As :meth:`Recomputer._run_cut`, on the remote device; a lost device or a failed
        run or download is a one-line error."""
        try:
            return wanted_arrays(group, run_main(vm, self._to_device(feed), _cut_name(group)), wanted)
        except Exception as err:
            lost = self._runtime.failure(err)
            if lost is not None:
                raise lost from None
            raise ProbeError(f"cannot recompute values inside kernel {group.name} on {self._runtime.where}: "
                             f"{one_line(err)}") from None

    def _built(self, group):
        if self._runtime.lost:
            self._runtime.reconnect()
        if self._generation != self._runtime.generation:  # what a lost session held is gone
            self._vm, self._generation = None, self._runtime.generation
        return super()._built(group)

    def _loads_alongside(self) -> bool:
        return False  # the upload would share the RPC session with the run

    def _load(self, executable):
        from tvm import relax

        module = self._runtime.connection.upload(executable, "tvm_probe_cuts.so")
        try:
            return relax.VirtualMachine(module, self._runtime.device)
        except Exception as err:
            raise RemoteError(f"cannot start the VM of the cut modules on {self._runtime.where}: "
                              f"{one_line(err)}") from None

    def _to_device(self, arrays: list[np.ndarray]) -> list:
        return [self._runtime.to_device(a) for a in arrays]


# ------------------------------------------------------------------------------------- server
class Server:
    """A TVM RPC server whose sessions can be instrumented by tvm_probe (``tvm-probe serve``).

    Each client is served by TVM's session loop in a child process of its own, which loads
    tvm_probe's native instrument library first (TVM's ``load_library``): that registers the
    capture functions a client drives.  The library is built here if needed (once per machine).

    Clients that connect directly are served at the same time (TVM's stock server serves one
    session at a time, so a second probe of the same server would wait for the first to be
    gone: two stages of a pipeline on one device would never start).  With a tracker, TVM's own
    loop runs: it registers with the tracker, which hands the server to one client at a time,
    as it does for every TVM server.

    Args:
        host: address to listen on (``0.0.0.0``: every interface).
        port: port to listen on; 0 lets the system pick a free one (see :attr:`port`).
        tracker: ``'HOST:PORT'`` of a TVM RPC tracker to register with, under ``key``.
        key: the device key (required with a tracker).
        custom_addr: the address to report to the tracker (default: what the tracker sees).

    Raises:
        ProbeError: the instrument cannot be built here, the port is taken, the tracker cannot
            be reached or no key was given for it.
    """

    def __init__(self, host: str = "0.0.0.0", port: int = 9190, tracker: str | None = None, key: str = "",
                 custom_addr: str | None = None):
        from . import native

        try:
            native.load()
        except native.NativeUnavailable as err:
            raise ProbeError(f"tvm-probe serve needs tvm_probe's native instrument, which cannot be built here: "
                             f"{err}") from None
        self.library = str(native.library_path())
        self.tracker = _address(tracker) if tracker is not None else None
        if tracker is not None and self.tracker is None:
            raise ProbeError(f"--tracker must be HOST:PORT, got {tracker!r}")
        if self.tracker is not None and not key:
            raise ProbeError("--tracker needs --key: the device key clients ask the tracker for")
        if self.tracker is not None:
            try:
                socket.create_connection(self.tracker, timeout=_CONNECT_TIMEOUT_S).close()
            except OSError as err:
                raise ProbeError(f"cannot reach the RPC tracker at {tracker} ({err})") from None
        self.key, self.custom_addr = key, custom_addr
        self.sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self.sock.bind((host, port))
        except OSError as err:
            self.sock.close()
            raise ProbeError(f"cannot listen on {host}:{port} ({err.strerror or err})") from None
        self.sock.listen(8)
        self.host, self.port = host, self.sock.getsockname()[1]
        self._failure: BaseException | None = None
        self._closing = False

    def describe(self) -> str:
        """One line: where it listens, and the tracker it registered with."""
        where = f"{self.host}:{self.port}"
        if self.tracker is not None:
            where += f", registered as {self.key!r} with the tracker at {self.tracker[0]}:{self.tracker[1]}"
        elif self.key:
            where += f", key {self.key!r}"
        return where

    def serve_forever(self) -> None:
        """Serve until Ctrl-C or SIGTERM; then end the sessions being served.

        Raises:
            ProbeError: TVM's server loop stopped by itself (e.g. the tracker went away for good).
        """
        from tvm.rpc import server as tvm_server  # TVM 0.27's loop: accept, handshake, tracker, fork

        loop = self._accept_loop if self.tracker is None else tvm_server._listen_loop
        thread = threading.Thread(target=self._loop, args=(loop,), daemon=True, name="tvm_probe-rpc-listen")
        previous = _on_sigterm_raise_interrupt()
        os.register_at_fork(after_in_child=_default_sigterm)  # sessions die of SIGTERM as usual
        thread.start()
        try:
            while thread.is_alive():
                thread.join(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            _restore_sigterm(previous)
            self.close()
        if self._failure is not None and not self._closing:
            raise ProbeError(f"the RPC server stopped: {one_line(self._failure)}")

    def _loop(self, listen_loop) -> None:
        try:
            listen_loop(self.sock, self.port, self.key, self.tracker, self.library, self.custom_addr)
        except BaseException as err:  # reported by serve_forever
            self._failure = err

    def _accept_loop(self, sock, port, key, tracker, library, custom_addr) -> None:
        """Accept clients for ever, each served at once in a process of its own (no tracker)."""
        while True:
            try:
                conn, addr = sock.accept()
            except OSError:
                if self._closing:
                    return
                raise
            try:
                conn.settimeout(_CONNECT_TIMEOUT_S)  # a peer that sends nothing must not stop the loop
                opts = _handshake(conn, key)
            except OSError as err:
                _rpc_log().warning("handshake with %s failed: %s", addr, err)
                conn.close()
                continue
            if opts is not None:
                conn.settimeout(None)
                self._start_session(conn, addr, opts)

    def _start_session(self, conn, addr, opts: dict) -> None:
        """Serve ``conn`` in a child process with a work folder of its own (TVM's session loop)."""
        import multiprocessing

        from tvm.rpc import server as tvm_server
        from tvm.support import utils

        work = utils.tempdir()
        proc = multiprocessing.Process(target=tvm_server._serve_loop, args=(conn, self.library, work))
        proc.start()
        conn.close()  # the child has it
        _rpc_log().info("serving %s in process %d", addr, proc.pid)
        threading.Thread(target=_reap, args=(proc, work, opts.get("timeout"), addr), daemon=True).start()

    def close(self) -> None:
        """Stop listening and end the sessions being served (their processes are killed)."""
        import multiprocessing

        self._closing = True
        for child in multiprocessing.active_children():
            child.kill()  # a session runs in C++ (TVM's server loop): SIGTERM would wait for Python
            child.join(5)
        self.sock.close()


def _rpc_log():
    """TVM's RPC server log (what ``tvm-probe serve -q`` quiets)."""
    return logging.getLogger("RPCServer")


def _handshake(conn, key: str) -> dict | None:
    """TVM RPC's opening exchange on a new connection (magic, ``client:KEY``, then ``server:KEY``);
    the client's options (``-timeout=S``), or None for a client that is not one or has another key."""
    import struct

    from tvm.rpc import base

    magic = struct.unpack("<i", base.recvall(conn, 4))[0]
    if magic != base.RPC_MAGIC:
        conn.close()
        return None
    length = struct.unpack("<i", base.recvall(conn, 4))[0]
    words = base.recvall(conn, length).decode("utf-8").split()
    if not words or words[0] != "client:" + key:
        conn.sendall(struct.pack("<i", base.RPC_CODE_MISMATCH))
        conn.close()
        _rpc_log().warning("a client with another key (%s) was refused", words[0] if words else "none")
        return None
    reply = ("server:" + key).encode("utf-8")
    conn.sendall(struct.pack("<i", base.RPC_CODE_SUCCESS) + struct.pack("<i", len(reply)) + reply)
    timeouts = [float(w[len("-timeout="):]) for w in words[1:] if w.startswith("-timeout=")]
    return {"timeout": timeouts[-1]} if timeouts else {}


def _reap(proc, work, timeout: float | None, addr) -> None:
    """Wait for a session's process (ending it after the client's session timeout), then remove
    its work folder."""
    proc.join(timeout or None)
    if proc.is_alive():
        _rpc_log().info("session of %s timed out", addr)
        proc.kill()
        proc.join()
    work.remove()
    _rpc_log().info("finished serving %s", addr)


def _on_sigterm_raise_interrupt():
    """SIGTERM ends ``serve_forever`` like Ctrl-C (in the main thread only); returns the old handler."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(*_args):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, handler)


def _default_sigterm() -> None:
    """In a forked session process: SIGTERM ends it (the server's own handler would not)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _restore_sigterm(previous) -> None:
    if previous is not None:
        signal.signal(signal.SIGTERM, previous)
