"""The native capture instrument: ``instrument.cc``, compiled once per machine, loaded on demand.

The Relax VM calls its instrument twice per Call instruction.  A Python instrument costs ~3 us a
call (a few hundred a run make a sub-millisecond model 2-3x slower); this one is a C++ function
built with tvm-ffi that counts, times and copies by itself, so Python runs only before and after
a run.  :mod:`tvm_probe.capture` uses it when it can and says which instrument ran.

    native = load()                      # NativeUnavailable (with the reason) when it cannot
    session = native.open(encode_plan(sites, arena_bytes))
    vm.set_instrument(session.instrument())   # or by name: "tvm_probe.capture.instrument", id
    session.begin(arena.ctypes.data); vm["main"](...); session.end()   # then .times, .stats

A server process that loaded the library (``tvm-probe serve``) is driven the same way over TVM
RPC by :mod:`tvm_probe.capture.remote`: the session copies into an arena of its own and keeps untracked
inputs instead of calling back, and the client downloads times, stats and arena after the run.
On a device other than the CPU a plan can sync the device around each kernel call
(``encode_plan(..., sync_device=...)``), so kernel times are device times.

Building needs a C++ compiler (``$CXX`` or ``c++``) and ``ninja`` (what ``tvm_ffi.cpp.build``
drives; ``pip install ninja`` or the ``apache-tvm-ffi[cpp]`` extra).  The library is cached under
``$TVM_PROBE_CACHE_DIR`` (default ``~/.cache/tvm_probe``) in a file named by a hash of the
source, the tvm-ffi version and the platform, so each machine compiles it once.
"""
from __future__ import annotations

import hashlib
import logging
import os
import platform
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...core import dtypes
from ...core.memory import ALIGN  # (every tensor in an arena starts on a cache line)

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("instrument.cc")
PLAN_MAGIC = "tvm_probe.plan.2"
#: The global function a VM's ``set_instrument`` can be given by name, with a session id.
FACTORY = "tvm_probe.capture.instrument"
MAX_DIMS = 8  # shapes are stored inline in the C++ plan (kMaxDims)


class NativeUnavailable(RuntimeError):
    """The native instrument cannot be used here; the message says why."""


# ------------------------------------------------------------------------------------- building
def cache_dir() -> Path:
    """Where compiled libraries are kept: ``$TVM_PROBE_CACHE_DIR`` or ``~/.cache/tvm_probe``."""
    return Path(os.environ.get("TVM_PROBE_CACHE_DIR") or Path.home() / ".cache" / "tvm_probe")


def library_path() -> Path:
    """The cached library for this source, tvm-ffi version and platform."""
    import tvm_ffi

    key = hashlib.sha256()
    for part in (SOURCE.read_bytes(), tvm_ffi.__version__.encode(), sys.platform.encode(),
                 platform.machine().encode()):
        key.update(part)
        key.update(b"\0")
    return cache_dir() / "native" / f"instrument-{key.hexdigest()[:16]}.so"


def _missing_tools() -> list[str]:
    compiler = os.environ.get("CXX", "c++")
    return [tool for tool in (compiler, "ninja") if shutil.which(tool) is None]


def build(path: Path) -> Path:
    """Compile ``instrument.cc`` with ``tvm_ffi.cpp.build`` and move the library to ``path``.

    The library appears at ``path`` in one rename, so a build that is interrupted (or runs in
    two processes at once) never leaves a half-written file where :func:`load` looks.
    """
    import tvm_ffi.cpp

    missing = _missing_tools()
    if missing:
        raise NativeUnavailable(f"{' and '.join(missing)} not found on PATH")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=".build-") as tmp:
        built = tvm_ffi.cpp.build("tvm_probe_instrument", sources=[str(SOURCE)], build_directory=tmp)
        staged = Path(tmp) / path.name
        shutil.copyfile(built, staged)
        os.replace(staged, path)
    return path


_loaded: "NativeLibrary | NativeUnavailable | None" = None  # the outcome, once known


def load() -> "NativeLibrary":
    """The native instrument library, built on first use; raises :class:`NativeUnavailable`.

    The outcome (library or failure) is remembered for the process, so a failed build is not
    tried again by every probe.
    """
    global _loaded
    if _loaded is None:
        try:
            _loaded = _load()
        except NativeUnavailable as err:
            _loaded = err
    if isinstance(_loaded, NativeUnavailable):
        raise _loaded
    return _loaded


def loaded() -> "NativeLibrary | None":
    """The library if this process loaded it already (None: not loaded, or it cannot be)."""
    return _loaded if isinstance(_loaded, NativeLibrary) else None


def _load() -> "NativeLibrary":
    try:
        import tvm_ffi

        path = library_path()
        if not path.exists():
            log.info("building tvm_probe's native instrument (once per machine) into %s", path)
            build(path)
        tvm_ffi.load_module(str(path))  # registers the tvm_probe.capture.* global functions
        return NativeLibrary(tvm_ffi)
    except NativeUnavailable:
        raise
    except Exception as err:  # a failed compile, an unloadable library: fall back, say why
        log.debug("native instrument build or load failed", exc_info=True)
        first_line = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise NativeUnavailable(f"building or loading {SOURCE.name} failed: {first_line}") from err


class NativeLibrary:
    """The ``tvm_probe.capture.*`` global functions of the loaded library."""

    can_call_back = True  # sessions in this process can call Python back (on_event)

    def __init__(self, tvm_ffi):
        prefix = "tvm_probe.capture."
        for name in ("open", "instrument", "buffers", "begin", "end", "unexpected", "error", "arena",
                     "kept", "close"):
            setattr(self, f"_{name}", tvm_ffi.get_global_func(prefix + name))
        self.noop = tvm_ffi.get_global_func(prefix + "noop")  # an instrument that does nothing
        for name in ("hook_switch", "hook", "close_switch", "hooked_call"):
            setattr(self, f"_{name}", tvm_ffi.get_global_func(prefix + name))
        #: ``aliases(result, *tensors) -> int``: bit i set when ``result`` may refer to tensor i's memory
        self.aliases = tvm_ffi.get_global_func(prefix + "aliases")
        self._prepare_call = tvm_ffi.get_global_func(prefix + "prepare_call")
        #: ``watch_record(address)``: where sessions of watched kernel maps write the call in flight
        #: (:mod:`tvm_probe.capture.watch`; 0: nowhere); ``watch_session(session id, table)``
        self.watch_record = tvm_ffi.get_global_func(prefix + "watch_record")
        self.watch_session = tvm_ffi.get_global_func(prefix + "watch_session")

    def switch(self) -> "HookSwitch":
        """A new switch for the kernel hooks of one VM (see :class:`HookSwitch`)."""
        return HookSwitch(self, int(self._hook_switch()))

    def open(self, plan: str) -> "NativeSession":
        """A session for ``plan`` (see :func:`encode_plan`)."""
        return NativeSession(self, int(self._open(plan)))

    def prepare_call(self, function, params: list, arguments: list["PreparedArgument"],
                     hooked: tuple["HookSwitch", "NativeSession", int] | None = None) -> "PreparedCall":
        """``function``'s calls with ``params`` (every parameter's argument: the held weights,
        None where a caller's argument goes) in one native call each (see :class:`PreparedCall`);
        ``hooked``: its VM's switch, the session to point it at, and the calls the plan expects."""
        spec = [word for argument in arguments for word in argument.encoded()]
        switch, session, expected = hooked if hooked is not None else (None, None, 0)
        call, status = self._prepare_call(function, params, spec, switch.id if switch else 0,
                                          session.id if session else 0, expected)
        return PreparedCall(call, np.from_dlpack(status), (switch, session))


# ------------------------------------------------------------------------------------- plans
@dataclass(frozen=True)
class Slot:
    """Where one copied output goes in the arena, and the type the VM must give it."""

    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


#: a site's action: copy its outputs into the arena, hand them to on_event, or copy them into
#: the session's own arena, grown as needed, each output's place and shape written in its layout
#: row (symbolic shapes, whose sizes change from call to call): the arena starts with a header
#: (:func:`arena_header` reads it)
COPY, EMIT, COPY_DYNAMIC = 1, 2, 3
LAYOUT_WIDTH = 3 + MAX_DIMS  # a layout row: offset, nbytes (-1: not copied), ndim, dims


def arena_header(arena: np.ndarray, rows: int, sites: int) -> tuple[np.ndarray, np.ndarray]:
    """What a dynamic session's arena starts with, as views (whoever holds the arena holds
    its run's header): the ``rows`` layout rows (int64 ``[rows, LAYOUT_WIDTH]``, one per
    output of a COPY_DYNAMIC site, in site order) and the run's times (float64 ``[2, sites]``,
    as :attr:`NativeSession.times` held them at the run's end)."""
    times_at = -(-rows * LAYOUT_WIDTH * 8 // ALIGN) * ALIGN
    layout = arena[:rows * LAYOUT_WIDTH * 8].view(np.int64).reshape(rows, LAYOUT_WIDTH)
    return layout, arena[times_at:times_at + 2 * sites * 8].view(np.float64).reshape(2, sites)


@dataclass(frozen=True)
class NativeSite:
    """One call site as the native instrument sees it (``action`` 0: time it only)."""

    symbol: str
    is_view: bool
    num_inputs: int
    action: int = 0
    untracked: tuple[int, ...] = ()
    outputs: tuple[Slot, ...] = field(default_factory=tuple)


def numpy_dtype(dtype: str) -> np.dtype:
    """The numpy dtype holding ``dtype``'s bytes unchanged, as ``tvm.runtime.Tensor.numpy()``
    returns it; :class:`NativeUnavailable` for packed or vector types (int4, float32x4)."""
    import tvm_ffi

    t = tvm_ffi.dtype(dtype)
    result = dtypes.numpy_dtype(dtype)
    if t.lanes != 1 or result is None or result.itemsize * 8 != t.bits:
        raise NativeUnavailable(f"dtype {dtype} has no byte-for-byte numpy form")
    return result


def layout(outputs: list[tuple[tuple[int, ...], str]], start: int = 0) -> tuple[list[Slot], int]:
    """Arena slots for ``(shape, dtype)`` outputs placed one after another from ``start``;
    returns the slots and the end offset."""
    slots, offset = [], start
    for shape, dtype in outputs:
        nbytes = int(np.prod(shape, dtype=np.int64)) * numpy_dtype(dtype).itemsize
        slots.append(Slot(offset, nbytes, dtype, tuple(int(d) for d in shape)))
        offset += -(-nbytes // ALIGN) * ALIGN
    return slots, offset


def encode_plan(sites: list[NativeSite], arena_bytes: int, signal_check_ms: float = 20.0,
                sync_device: tuple[int, int] | None = None) -> str:
    """The text the C++ side parses (format: ``ParsePlan`` in instrument.cc).

    ``sync_device`` (DLPack device type, index), when given, is synchronized around every kernel
    call, so that kernel times are device times (the host clock around a device sync).
    """
    import tvm_ffi

    symbols = list(dict.fromkeys(s.symbol for s in sites))
    bad = [s for s in symbols if not s or any(c.isspace() for c in s)]
    if bad:
        raise NativeUnavailable(f"kernel symbol {bad[0]!r} cannot be written into a native plan")
    deep = [o for s in sites for o in s.outputs if len(o.shape) > MAX_DIMS]
    if deep:
        raise NativeUnavailable(f"a kernel output has {len(deep[0].shape)} dimensions (at most {MAX_DIMS})")
    ids = {s: i for i, s in enumerate(symbols)}
    sync_type, sync_id = sync_device or (0, 0)
    words: list = [PLAN_MAGIC, arena_bytes, signal_check_ms, sync_type, sync_id, len(symbols), *symbols,
                   len(sites)]
    for s in sites:
        words += [ids[s.symbol], int(s.is_view), s.num_inputs, s.action, len(s.untracked), *s.untracked,
                  len(s.outputs)]
        for o in s.outputs:
            t = tvm_ffi.dtype(o.dtype)
            # (a symbolic dimension, -1, only where nothing is copied: shapes are checked on copies)
            words += [o.offset, o.nbytes, t.type_code, t.bits, t.lanes, len(o.shape),
                      *(d if isinstance(d, int) else -1 for d in o.shape)]
    return " ".join(map(str, words))


# ------------------------------------------------------------------------------------- prepared calls
@dataclass(frozen=True)
class PreparedArgument:
    """One caller argument of a prepared call: the parameter ``position`` it goes to and, for a
    host array copied into a tensor held for it (``dtype`` set), what it must be: that dtype,
    ``shape`` (static), C-contiguous, and integer ids within ``[low, bound)`` when ``bound`` is
    set.  Anything else is passed as it is."""

    position: int
    dtype: str | None = None
    shape: tuple[int, ...] = ()
    low: int = 0
    bound: int | None = None

    def encoded(self) -> list[int]:
        """Its words in a prepare_call spec (``PrepareCall`` in instrument.cc)."""
        import tvm_ffi

        if self.dtype is None:
            return [self.position] + [0] * (8 + MAX_DIMS)
        t = tvm_ffi.dtype(self.dtype)
        dims = list(self.shape) + [0] * (MAX_DIMS - len(self.shape))
        return [self.position, 1, t.type_code, t.bits, t.lanes, len(self.shape), *dims,
                int(self.bound is not None), self.low, self.bound or 0]


RAN, NANOS, CHANGED, COPIED, EXPECTED = range(5)  # the entries of PreparedCall.status


class PreparedCall:
    """A function's whole call in one native call: ``call(*args)`` (the caller's arguments,
    the held weights left out) checks and copies each host array into a tensor held for it,
    runs the function with every argument in place (through its hooks, when hooked), and gives
    up a held tensor the result may refer to; returns what the function returned.

    :attr:`status` (int64, rewritten by each call): ``[RAN]`` 0 when an argument was refused
    and nothing ran (the caller takes its checked path, which says what is wrong), ``[NANOS]``
    the function's wall time, ``[CHANGED]`` 1 when the hooked kernels were called other than the
    plan expects (``[EXPECTED]`` calls of them, set when prepared), ``[COPIED]`` bytes the hooks
    copied.
    """

    __slots__ = ("call", "status", "_keep")

    def __init__(self, call, status: np.ndarray, keep: tuple):
        self.call, self.status = call, status
        self._keep = keep  # (the switch and session it uses: closed only after it)


# ------------------------------------------------------------------------------------- sessions
UNEXPECTED, COPIED_BYTES, STOPPED, CALLED = range(4)  # the entries of NativeSession.stats


class NativeSession:
    """One plan loaded into the native instrument; reused run after run.

    Attributes:
        times: float64 ``[2, sites]`` written by each run: start (row 0) and duration (row 1)
            of each call in us, NaN for a call that did not happen.  A view of the instrument's own buffer,
            overwritten by the next run.
        stats: int64 ``[4]`` written by each run: calls matching no site (UNEXPECTED), bytes
            copied (COPIED_BYTES), 1 if the instrument stopped the run (STOPPED), call sites
            called (CALLED).
    """

    def __init__(self, library: NativeLibrary, session_id: int):
        self._lib, self.id = library, session_id
        times, stats = library._buffers(session_id)
        self.times = np.from_dlpack(times).reshape(2, -1)
        self.stats = np.from_dlpack(stats)

    def instrument(self):
        """The ``ffi.Function`` to give ``vm.set_instrument`` (the factory :data:`FACTORY`
        makes the same from the session id)."""
        return self._lib._instrument(self.id)

    def begin(self, arena_address: int = 0, on_event=None) -> None:
        """Reset before a run.  Outputs are copied to ``arena_address`` (memory the caller
        owns, at least the plan's arena size) or, with 0, to an arena of the session's own
        (:meth:`arena`).  ``on_event(kind, site, *tensors)`` gets untracked inputs (kind 0,
        before the call) and the outputs of EMIT sites (kind 1, after it); without it,
        untracked inputs are kept for :meth:`kept` (and a plan with EMIT sites fails)."""
        self._lib._begin(self.id, arena_address, on_event)

    def end(self) -> None:
        """After a run: drop the ``on_event`` callback and ignore calls until the next
        :meth:`begin` (a run nobody began must not write into a freed arena)."""
        self._lib._end(self.id)

    def unexpected(self) -> list[str]:
        """The first calls of the last run that matched no call site (``stats[UNEXPECTED]``
        counts them all)."""
        return [u for u in str(self._lib._unexpected(self.id)).split("\n") if u]

    def error(self) -> str:
        """Why the instrument stopped the last run ("" when it did not)."""
        return str(self._lib._error(self.id))

    def arena(self) -> np.ndarray | None:
        """The session's own arena of the last run, when :meth:`begin` got no address."""
        arena = self.arena_tensor()
        return None if arena is None else np.from_dlpack(arena)

    def arena_tensor(self):
        """:meth:`arena` as the runtime's tensor (holding it keeps it from reuse, as a view
        does; a view costs microseconds more right after a run)."""
        return self._lib._arena(self.id)

    def kept(self, site: int, position: int) -> np.ndarray | None:
        """Untracked input ``position`` of call site ``site`` in the last run, copied before the
        call because :meth:`begin` got no ``on_event``; None when it was not."""
        tensor = self._lib._kept(self.id, site, position)
        return None if tensor is None else tensor.numpy()

    def close(self) -> None:
        if self.id is not None:
            self._lib._close(self.id)
            self.id = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone already
            pass


class HookSwitch:
    """Which session the native kernel hooks of one VM report to (none between runs).

    :meth:`hook` wraps a compiled kernel: while the switch points at a session (during
    :meth:`call`), each call of the wrapper runs the kernel between the session's own
    bookkeeping for ``symbol`` (count, time, copy what the plan asks): what the instrument does
    for that kernel, without TVM's instrument dispatch on every VM instruction.  Pointed at no
    session, a wrapper just calls its kernel.
    """

    def __init__(self, library: NativeLibrary, switch_id: int):
        self._lib, self.id = library, switch_id

    def hook(self, symbol: str, kernel):
        """``kernel`` (an ``ffi.Function``) reporting its calls as calls of ``symbol``."""
        return self._lib._hook(self.id, symbol, kernel)

    def call(self, session: "NativeSession", arena_address: int, on_event, function, args):
        """``function(*args)`` with the hooks pointed at ``session``, begun with ``arena_address``
        and ``on_event`` (see :meth:`NativeSession.begin`) and ended after, in one native call."""
        return self._lib._hooked_call(self.id, session.id, arena_address, on_event, function, *args)

    @property
    def native_call(self):
        """The native function :meth:`call` calls, taking ``(switch id, session id, arena address,
        on_event, function, *args)``: for a caller that fixes its arguments once and calls it
        run after run (:class:`~tvm_probe.capture.fast_call.FastCall`), where :meth:`call`'s own
        frame would show."""
        return self._lib._hooked_call

    def __del__(self):
        try:
            self._lib._close_switch(self.id)  # the hooks keep what they need of it
        except Exception:  # interpreter shutdown
            pass
