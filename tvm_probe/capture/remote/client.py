"""The probe's end of a remote device: connecting, uploading the executable, runs driven through
the instrument by name, tensors brought back, recomputation there (see :mod:`tvm_probe.capture.remote`)."""
from __future__ import annotations

import logging
import socket
import tempfile
from pathlib import Path

import numpy as np

from ...core.device import device_for, device_label
from ...core.errors import ProbeError, one_line
from ...core.native_log import native_log_to_logging
from .. import native
from ..recompute import Recomputer, _cut_name, wanted_arrays
from .spec import RemoteError, RemoteSpec, parse_remote

log = logging.getLogger(__name__)

_CONNECT_TIMEOUT_S = 10.0  # to reach a tracker (TVM retries for 60 s), or for a client's handshake


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
        local = device_for(target)
        try:
            remote = self.session.device(local.dlpack_device_type(), local.index)
            exists = remote.exist
        except Exception as err:
            raise RemoteError(f"cannot query the devices of {self.where}: {one_line(err)}") from None
        if not exists:
            raise RemoteError(f"the server at {self.where} has no {device_label(target)} device {local.index}: give a "
                              "target it can run")
        return remote


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
    """The native instrument's functions on a server: what :class:`~tvm_probe.capture.native.NativeLibrary`
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

    Same interface as :class:`~tvm_probe.capture.native.NativeSession`; what a run wrote is downloaded
    by :meth:`end` (times, stats) and :meth:`arena` (the copied outputs), each in one transfer.
    """

    def __init__(self, connection: Connection, session_id: int):
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

    The same cuts as :class:`~tvm_probe.capture.recompute.Recomputer` (one executable holding every
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

    def _to_device(self, arrays: list[np.ndarray]) -> list:  # (shapes and scalars go as they are)
        return [self._runtime.to_device(a) if isinstance(a, np.ndarray) else a for a in arrays]
