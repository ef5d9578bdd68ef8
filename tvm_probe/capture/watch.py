"""Watched runs: a kernel that kills the process is named by the process that watched it.

A TVM kernel that reads out of bounds (an ONNX Gather given an index far past its table) kills
the process it runs in with SIGSEGV: no exception reaches Python, so nothing names the kernel,
and nothing is said at all.  A watched run happens in a child process (``os.fork``) while its
parent waits::

    child (watched)                                     parent (the watcher)
    ├─ per executor, once: its site table               waits for the child
    │  (FOLDER/table-<n>.json: each call site's
    │  kernel symbol and source ops in words)
    ├─ before each kernel call: [table, site, KERNEL]
    │  into the in-flight record (64 bytes of a file
    │  both processes map; the native instrument
    │  writes it in C++, the Python one in Python:
    │  three stores a call)
    ├─ after the call: COPYING while the instrument
    │  copies its outputs, then BETWEEN
    └─ dies of a signal ──────────────────────────────▶ reads the record and the table:
                                                        KernelCrash("TVM's kernel 'take1' (source op
                                                        'gather_node' (Gather)) crashed the process
                                                        with SIGSEGV at kernel call #6")
       or returns / exits ────────────────────────────▶ its result / exit status, unchanged

* :func:`run_watched` ``(function, *args, **kwargs)``: ``function``'s result (pickled back from
  the child), or :class:`~tvm_probe.core.errors.KernelCrash`; what it raised is raised again.
* :func:`fork_watched`: like ``os.fork``, None in the child, which goes on watched; the child's
  exit status in the parent, or KernelCrash (what ``tvm-probe run`` does).

The kernel is named where the run watches every kernel call: TVM's instrument (a probe's first
run, native or Python) or a VM hooking every kernel (``capture="all"``, ``kernel_times=True``).
A later run that hooks some kernels (a selection) or none (``capture=None``) says the process
died after the last watched call returned, in a kernel it did not watch or in TVM's VM.
Nothing of the child's work comes back but the result: a probe run there keeps its captures
there (run it again in this process once it is known not to crash).

Dumps and reports are written into a temporary folder and moved into place whole
(:mod:`tvm_probe.store.atomic`), so a child that dies leaves none half-written, and an earlier
dump stays as it was.  The child dies quietly: TVM's SIGSEGV handler (a backtrace on stderr) and
Python's faulthandler are turned off there unless ``TVM_PROBE_TRACEBACK`` is set; a child whose
watcher dies is killed with it (Linux).  Ctrl-C from a terminal reaches both processes: the
child stops as it would unwatched, the parent waits for it (and passes the interrupt on when
only the parent got it).  SIGTERM and SIGHUP sent to the parent are passed on to the child, and
the parent then takes them as it would have.  Without ``os.fork`` nothing is watched: the work
runs in the calling process.
"""
from __future__ import annotations

import ctypes
import faulthandler
import itertools
import json
import mmap
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import weakref
from pathlib import Path

import numpy as np

from ..core.describe import describe_ops, source_order
from ..core.errors import InternalError, KernelCrash, one_line
from ..diagnose.failures import TVMFailure
from . import native

#: ``0`` (or ``off``): ``tvm-probe`` runs its commands in its own process, unwatched.
WATCH_ENV = "TVM_PROBE_WATCH"
#: Set: a watched process keeps TVM's backtrace on SIGSEGV (and Python's faulthandler).
TRACEBACK_ENV = "TVM_PROBE_TRACEBACK"

# The in-flight record: int64 slots.  The native instrument writes TABLE, SITE and STATE
# (instrument.cc, "watch"); MAGIC is written last, so a record without it is none.
RECORD, RESULT = "in-flight", "result.pickle"
MAGIC = int.from_bytes(b"tvmprobe", "little")
_MAGIC, _PID, TABLE, SITE, STATE, EVERY = range(6)
RECORD_SLOTS = 8
#: STATE: outside any run of a model; call site SITE's kernel in flight; the instrument copying
#: its outputs; inside a run, after SITE returned (-1: none yet); a kernel call with no call site
#: in flight (inside an If branch, a helper lowering added: the Python instrument sees those).
#: EVERY: 1 when the run watches every kernel call (TVM's instrument, a VM hooking every kernel)
NOT_RUNNING, KERNEL, COPYING, BETWEEN, OTHER = range(5)

#: Signals of a process that crashed (others stopped or killed it)
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGABRT,
                           signal.SIGTRAP, signal.SIGSYS})
_GRACE_S = 3.0  # after Ctrl-C: how long the child has to stop by itself before it is told, then killed
_HELPER = "a helper kernel TVM's lowering added"


# -- the watched process ----------------------------------------------------------------------------
class InFlight:
    """The watched process's side, in ``folder``: the in-flight record (mapped, shared with the
    watcher) and the site tables.  The Python instrument writes the record through
    :meth:`kernel` and :meth:`state`; the native one at :attr:`native_address`."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        fd = os.open(self.folder / RECORD, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, RECORD_SLOTS * 8)
            self._map = mmap.mmap(fd, RECORD_SLOTS * 8)
        finally:
            os.close(fd)
        self.record = np.frombuffer(self._map, dtype=np.int64)
        self.record[TABLE:STATE] = -1
        self.record[_PID] = os.getpid()
        self.record[_MAGIC] = MAGIC
        #: where the native instrument writes [table, site, state]
        self.native_address = self.record.ctypes.data + TABLE * 8
        self._tables: set[int] = set()

    def kernel(self, table: int, site: int) -> None:
        """Call site ``site`` of table ``table`` is about to run."""
        record = self.record
        record[TABLE] = table
        record[SITE] = site
        record[STATE] = KERNEL

    def state(self, state: int) -> None:
        """The call in flight moved on: COPYING its outputs, BETWEEN calls, or OTHER (a kernel
        call with no call site is in flight)."""
        self.record[STATE] = state

    def run_begins(self, table: int, every_kernel: bool) -> None:
        """A run of table ``table``'s call sites begins; it watches every kernel call or some."""
        record = self.record
        record[TABLE], record[SITE], record[STATE], record[EVERY] = table, -1, BETWEEN, int(every_kernel)

    def run_ends(self) -> None:
        self.record[STATE] = NOT_RUNNING

    def write_table(self, table: int, kernel_map, sources, function: str) -> None:
        """Site table ``table``: per call site (then per call of a helper kernel the native plan
        times, as it numbers them) its symbol, its source ops in words and their keys."""
        if table in self._tables:
            return
        rows = []
        for site in kernel_map.sites:
            keys = source_order([k for outs in site.output_keys for k in outs] + list(site.interior_keys), sources)
            rows.append([site.symbol, describe_ops(keys, sources) if keys else "", list(keys)])
        for symbol, count in getattr(kernel_map, "fixed_helpers", {}).items():
            rows += [[symbol, _HELPER, []]] * count
        partial = self.folder / f".table-{table}.partial"
        partial.write_text(json.dumps({"function": function, "sites": rows}))
        os.replace(partial, self.folder / f"table-{table}.json")
        self._tables.add(table)


_active: InFlight | None = None  # this process's, when it is watched
_table_ids = itertools.count()
# the executors of this process: owner → (table, kernel map, sources, function); a child forked
# later writes the tables of those still alive
_owners: "weakref.WeakKeyDictionary[object, tuple]" = weakref.WeakKeyDictionary()


def register(owner, kernel_map, sources, function: str) -> int:
    """The site-table number of ``owner``'s kernel map (an executor: the table lives as long as
    it does); the table is written now when this process is watched, else when a watched child
    is forked."""
    table = next(_table_ids)
    _owners[owner] = (table, kernel_map, sources, function)
    if _active is not None:
        _quiet_crashes()  # (TVM, loaded by now, set its SIGSEGV handler when it was)
        _active.write_table(table, kernel_map, sources, function)
    return table


def flight() -> InFlight | None:
    """This process's in-flight record when it is watched, else None."""
    return _active


def attach_native(library) -> None:
    """Point ``library`` (the native instrument's, loaded in this process) at the in-flight
    record when this process is watched."""
    if _active is not None and hasattr(library, "watch_record"):
        library.watch_record(_active.native_address)


def wanted() -> bool:
    """Whether ``tvm-probe`` should watch its work: ``os.fork`` exists, ``$TVM_PROBE_WATCH`` is
    not 0/off, and this process is not watched already."""
    setting = os.environ.get(WATCH_ENV, "").strip().lower()
    return hasattr(os, "fork") and setting not in ("0", "off", "no", "false") and _active is None


def _become_watched(folder: Path, parent: int) -> None:
    """In the child, right after the fork: die with the watcher, open the record, write the
    tables of the executors alive, point the native instrument at the record."""
    global _active
    _die_with(parent)
    _active = InFlight(folder)
    library = native.loaded()
    if library is not None:
        attach_native(library)
    for table, kernel_map, sources, function in list(_owners.values()):
        _active.write_table(table, kernel_map, sources, function)
    _quiet_crashes()


def _die_with(parent: int) -> None:
    """Linux: the kernel kills this child when its watcher dies (``PR_SET_PDEATHSIG``)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the watcher died before that
        os._exit(1)


def _quiet_crashes() -> None:
    """Let a crash kill this (watched) process without TVM's backtrace or Python's faulthandler
    on stderr: its watcher says what crashed, in one line."""
    if os.environ.get(TRACEBACK_ENV) or threading.current_thread() is not threading.main_thread():
        return
    if faulthandler.is_enabled():
        faulthandler.disable()
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)


# -- the watcher ------------------------------------------------------------------------------------
def run_watched(function, *args, **kwargs):
    """``function(*args, **kwargs)`` in a watched child process: its result, pickled back.

    The child is forked, so it starts with everything this process holds (a built probe: run
    ``run_watched(probe.run, inputs)``); what it changes stays there.

    Raises:
        KernelCrash: the child died of a signal; names the kernel in flight, its call and source
            ops (``err.failure.stage`` is ``"runtime-crash"``).
        InternalError: it died while tvm_probe's instrument copied a kernel's outputs (ours).
        KeyboardInterrupt: it was interrupted.
        Exception: what ``function`` raised, raised again here (without its traceback).
    """
    if not hasattr(os, "fork"):
        return function(*args, **kwargs)
    folder = Path(tempfile.mkdtemp(prefix="tvm_probe-watch-"))
    forwarded: list[int] = []
    try:
        pid = _fork(folder)
        if pid == 0:
            _child_call(folder, function, args, kwargs)  # never returns
        status, interrupted = _wait(pid, forwarded)
        _raise_if_died(status, interrupted, folder)
        try:
            ok, value = pickle.loads((folder / RESULT).read_bytes())
        except FileNotFoundError:
            raise InternalError(f"the watched process exited with status {os.waitstatus_to_exitcode(status)} "
                                "and no result: the function left its process by itself") from None
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        _take(forwarded)
    if ok:
        return value
    raise value


def fork_watched() -> int | None:
    """Fork a watched child: None in the child (it goes on with the work, watched, and exits as
    it would have); in the parent, the child's exit status once it ended (``tvm-probe``).

    Raises (in the parent): what :func:`run_watched` raises for a child that died.
    """
    if not hasattr(os, "fork"):
        return None
    folder = Path(tempfile.mkdtemp(prefix="tvm_probe-watch-"))
    pid = _fork(folder)
    if pid == 0:
        return None
    forwarded: list[int] = []
    try:
        status, interrupted = _wait(pid, forwarded)
        _raise_if_died(status, interrupted, folder)
        return os.waitstatus_to_exitcode(status)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        _take(forwarded)


def _fork(folder: Path) -> int:
    _flush()  # (what is buffered would be written twice)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        try:
            _become_watched(folder, parent)
        except BaseException as err:  # the child must never go on as the parent
            print(f"tvm-probe: internal error: cannot watch the run ({type(err).__name__}: {one_line(err)})",
                  file=sys.stderr)
            _flush()
            os._exit(3)
    return pid


def _child_call(folder: Path, function, args, kwargs) -> None:
    """The child of :func:`run_watched`: the call, its outcome pickled into the folder, exit."""
    code = 0
    try:
        try:
            payload = (True, function(*args, **kwargs))
        except BaseException as err:
            payload = (False, err)
        try:
            data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as err:
            what = "result" if payload[0] else f"exception ({type(payload[1]).__name__}: {one_line(payload[1])})"
            data = pickle.dumps((False, InternalError(f"the watched run's {what} cannot be brought back from its "
                                                      f"process ({one_line(err)})")))
        partial = folder / (RESULT + ".partial")
        partial.write_bytes(data)
        os.replace(partial, folder / RESULT)
    except BaseException:
        code = 1
    finally:
        _flush()
        os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # closed, or None (no console)
            pass


def _wait(pid: int, forwarded: list) -> tuple[int, bool]:
    """The child's wait status once it ended, and whether this process was interrupted meanwhile.
    SIGTERM and SIGHUP are passed on to the child meanwhile, and listed in ``forwarded`` (for
    :func:`_take`, once the watcher's folder is gone)."""
    previous = _forwarding(pid, forwarded)
    try:
        try:
            return os.waitpid(pid, 0)[1], False
        except KeyboardInterrupt:
            return _stop(pid), True
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _take(forwarded: list) -> None:
    """Take the signals passed on to the child as this process would have taken them."""
    for signum in dict.fromkeys(forwarded):
        os.kill(os.getpid(), signum)


def _forwarding(pid: int, got: list) -> dict:
    """Pass SIGTERM and SIGHUP on to the child while it runs; the handlers they replaced."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def forward(signum, _frame):
        got.append(signum)
        _kill(pid, signum)

    return {signum: signal.signal(signum, forward) for signum in (signal.SIGTERM, signal.SIGHUP)}


def _stop(pid: int) -> int:
    """After Ctrl-C here: from a terminal the child got it too and stops by itself; else it is
    told (SIGINT), then killed; a second Ctrl-C kills it at once.  Its wait status."""
    steps = (None, signal.SIGINT, signal.SIGKILL)
    step = 0
    while True:
        try:
            if steps[step] is not None:
                _kill(pid, steps[step])
            if steps[step] == signal.SIGKILL:
                return os.waitpid(pid, 0)[1]
            deadline = time.monotonic() + _GRACE_S
            while time.monotonic() < deadline:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    return status
                time.sleep(0.02)
            step += 1
        except KeyboardInterrupt:
            step = len(steps) - 1


def _kill(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


def _raise_if_died(status: int, interrupted: bool, folder: Path) -> None:
    if not os.WIFSIGNALED(status):
        return
    signum = os.WTERMSIG(status)
    if signum == signal.SIGINT or interrupted:
        raise KeyboardInterrupt
    raise crash_of(folder, signum)


# -- what the watcher says ----------------------------------------------------------------------------
def crash_of(folder: Path, signum: int) -> Exception:
    """The error for a watched process that died of ``signum``, from what it left in ``folder``:
    :class:`KernelCrash` (a kernel in flight, or none), or :class:`InternalError` when the
    instrument was copying a kernel's outputs."""
    name = _signal_name(signum)
    table, site, state, every = _read_record(folder)
    function, row = _table_row(folder, table, site)
    why = " (what the system's out-of-memory killer sends)" if signum == signal.SIGKILL else ""
    died = f"the process crashed with {name}" if signum in CRASH_SIGNALS else f"the process was killed with {name}{why}"
    call = f"kernel call #{site}" + (f" of '{function}'" if function not in ("", "main") else "")
    symbol, ops, keys = row if row is not None else (None, "", ())
    named = f"'{symbol}' ({ops or 'no source name'})"
    if state == KERNEL and row is not None:
        how = f"crashed the process with {name}" if signum in CRASH_SIGNALS else \
            f"was running when the process was killed with {name}{why}"
        return _crash(f"TVM's kernel {named} {how} at {call}", name, symbol, site, ops, keys, function)
    if state == COPYING and row is not None:
        return InternalError(f"{died} while tvm_probe's instrument copied the outputs of {call} {named}: a bug in "
                             "tvm_probe, not in TVM or the model; please report it with the model")
    after = f", after {call} {named} returned" if row is not None else ""
    if state == OTHER:
        message = (f"{died} in a kernel call that has no call site (inside an If branch, or a helper TVM's lowering "
                   f"added){after}")
    elif state in (KERNEL, COPYING):  # (its site table is not known)
        message = f"{died} at {call}, a kernel call of the model"
    elif state == BETWEEN and every:
        message = f"{died} in TVM's VM between kernel calls{after or ' before the first one'} (no kernel was running)"
    elif state == BETWEEN:
        message = (f"{died} while the model ran{after}, in a kernel this run did not watch or in TVM's VM (a run "
                   "that watches every kernel names it: capture='all')")
    else:
        message = (f"{died} outside the model's kernel calls (while importing, compiling, recomputing a value kept "
                   "inside a fused kernel, or running the reference)")
    return _crash(message, name, None, site if row is not None else None, ops, keys, function or "main")


def _crash(message: str, signal_name: str, kernel, call, ops: str, keys, function: str) -> KernelCrash:
    crash = KernelCrash(message, kernel=kernel, signal=signal_name, call=call, source_ops=ops, keys=tuple(keys),
                        function=function)
    crash.failure = TVMFailure("runtime-crash", message, error_type=signal_name,
                               kernels=(kernel,) if kernel else (), sites=(call,) if kernel else (),
                               keys=tuple(keys) if kernel else (),
                               unknown="" if kernel else "no kernel was running when the process died")
    return crash


def _read_record(folder: Path) -> tuple[int, int, int, int]:
    """``(table, site, state, every)`` of the record (a run of no table when there is none)."""
    try:
        raw = (folder / RECORD).read_bytes()
    except OSError:
        raw = b""
    record = np.frombuffer(raw, dtype=np.int64) if len(raw) == RECORD_SLOTS * 8 else None
    if record is None or int(record[_MAGIC]) != MAGIC:
        return -1, -1, NOT_RUNNING, 0
    return int(record[TABLE]), int(record[SITE]), int(record[STATE]), int(record[EVERY])


def _table_row(folder: Path, table: int, site: int) -> tuple[str, list | None]:
    """The function of site table ``table`` and row ``site`` of it (None: not known)."""
    if table < 0:
        return "", None
    try:
        written = json.loads((folder / f"table-{table}.json").read_text())
    except (OSError, ValueError):
        return "", None
    sites = written.get("sites", [])
    return written.get("function", "main"), sites[site] if 0 <= site < len(sites) else None


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"

