"""``tvm-probe serve``: a TVM RPC server whose sessions load tvm_probe's native instrument
(see :mod:`tvm_probe.capture.remote`)."""
from __future__ import annotations

import logging
import os
import signal
import socket
import threading

from ...core.errors import ProbeError, one_line
from .. import native
from .client import _CONNECT_TIMEOUT_S
from .spec import address

log = logging.getLogger(__name__)


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
        try:
            native.load()
        except native.NativeUnavailable as err:
            raise ProbeError(f"tvm-probe serve needs tvm_probe's native instrument, which cannot be built here: "
                             f"{err}") from None
        self.library = str(native.library_path())
        self.tracker = address(tracker) if tracker is not None else None
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
