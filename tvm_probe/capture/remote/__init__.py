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
sessions load tvm_probe's native instrument (:mod:`tvm_probe.capture.native`), which registers that
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
``tvm_probe.capture.native.library_path()`` names, built for the server's machine) serves the same
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

# (the client and server import TVM's RPC inside the functions that use it: importing them is light)
from .client import Connection, RemoteLibrary, RemoteRecomputer, RemoteRuntime, RemoteSession, connect, run_main
from .server import Server
from .spec import FORMS, KEYS, RemoteError, RemoteSpec, parse_remote, remote_problems

__all__ = ["FORMS", "KEYS", "RemoteError", "RemoteSpec", "parse_remote", "remote_problems", "connect",
           "Connection", "RemoteRuntime", "RemoteRecomputer", "RemoteSession", "RemoteLibrary", "run_main",
           "Server"]
