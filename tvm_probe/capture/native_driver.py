"""The native driver: TVM's instrument and the kernel hooks as C++ sessions (:mod:`tvm_probe.capture.native`).

The native instrument gets a plan per :class:`~tvm_probe.capture.plan.CapturePlan` (per call
site: time only, copy, or hand over to a streaming sink) and copies into one byte arena
allocated once and reused while nobody holds the previous run's arrays; Python runs only before
and after the run.  Calls the plan does not want cost a symbol lookup and two clock reads.

* :class:`NativeDriver`: the native instrument for one kernel map: one :class:`NativePlan` (a
  session, its arena layout and arenas) per CapturePlan, kept warm.
* :class:`NativeCalls`: one run under the native instrument (an :class:`~.observer.Observer`).
* :class:`HookedNativeCalls`: one run through a VM whose observed kernels are native hooks.
"""
from __future__ import annotations

import sys

import numpy as np

from ..core.errors import TVMBehaviourChanged, TVMRunError
from ..core.memory import Chunks, aligned_bytes
from ..kernel_map import ArgKind, KernelMap
from . import native
from .kernel_hook import HookedVM, host_array, host_copy
from .native import CALLED, COPIED_BYTES, COPY, EMIT, STOPPED, UNEXPECTED
from .observer import ExecutorHandle, Observer, behaviour_changed
from .plan import MAX_PLANS, CapturePlan
from .result import ArenaOutputs, Capture, LayoutOutputs
from .watch import attach_native


class NativeDriver:
    """The native instrument for one kernel map: plans per CapturePlan, sessions kept warm.

    Args:
        km: the kernel map.
        library: where sessions are opened: this process (default) or a remote server
            (:class:`tvm_probe.capture.remote.RemoteLibrary`).
        sync_device: ``(DLPack type, index)`` of a device to sync around every kernel call.
        dynamic: every wanted output is copied into the session's own arena, grown as needed,
            its place and shape read back after the run (the native hooks of a model with
            symbolic shapes: sizes change from call to call; see :meth:`NativePlan.outputs`).
        watch_table: the kernel map's site table in a watched process (its sessions write the
            call in flight, see :mod:`tvm_probe.capture.watch`); -1: none.
    """

    def __init__(self, km: KernelMap, library=None, sync_device: tuple[int, int] | None = None,
                 dynamic: bool = False, watch_table: int = -1):
        self._lib = library if library is not None else native.load()
        attach_native(self._lib)
        self._watch_table = watch_table
        self._km = km
        self._sync_device = sync_device
        self.dynamic = dynamic  # wanted outputs go into arenas sized by each call's shapes
        # every output dtype must have a byte-exact numpy form, or no plan could copy it
        self._dtypes = {d: native.numpy_dtype(d) for s in km.sites for d in s.out_dtypes}
        self._plans: dict[tuple[CapturePlan, bool], NativePlan] = {}
        self.plan(CapturePlan(), streaming=False)  # fail here, not in the first run

    def calls(self, handle: ExecutorHandle, plan: CapturePlan, capture: Capture, sink) -> "NativeCalls":
        """The observer of one run of ``plan`` under the native instrument."""
        # a library that cannot call back (remote) copies into its arena; the sink gets the
        # copies once they are downloaded
        streaming = sink is not None and self._lib.can_call_back
        return NativeCalls(handle, self.plan(plan, streaming), capture, sink)

    def switch(self):
        """A switch for the native hooks of one VM (:class:`tvm_probe.capture.native.HookSwitch`)."""
        return self._lib.switch()

    def plan(self, plan: CapturePlan, streaming: bool = False) -> "NativePlan":
        """``plan`` as a native session (made once, kept)."""
        key = (plan, streaming)
        prepared = self._plans.get(key)
        if prepared is None:
            if len(self._plans) >= MAX_PLANS:
                self._plans.pop(next(iter(self._plans)))  # the oldest; its session closes
            prepared = self._plans[key] = NativePlan(self._lib, self._km, plan, streaming, self._dtypes,
                                                      self._sync_device, self.dynamic and not streaming,
                                                      self._watch_table)
        return prepared


class NativePlan:
    """One CapturePlan as a native session: arena layout, arenas, how to read a run back.

    Args:
        lib: where the session is opened (see :class:`NativeDriver`).
        km: the kernel map.
        plan: what the session copies.
        streaming: wanted outputs go to Python as they are produced (EMIT), not into the arena.
        dtypes: dtype name → numpy dtype, for every output dtype of the kernel map.
        sync_device: ``(DLPack type, index)`` of a device to sync around every kernel call.
        dynamic: wanted outputs go into the session's own arena (COPY_DYNAMIC), sized by this
            call's shapes; :meth:`outputs` reads them back.
        watch_table: the kernel map's site table in a watched process (-1: none).
    """

    # arenas kept for reuse: the one the last run's Capture holds, and one to fill (calls that keep
    # their captures hold arenas anyway: theirs are one-offs, cut from chunks below)
    _POOL = 2
    # one-off arenas (a quarter of a chunk at most) are cut from chunks of this size
    # (core.memory.Chunks): a fresh arena of its own faults every 4 KiB (~80 faults for a 320 KiB
    # decode step) and costs microseconds to make
    _CHUNK = 16 << 20

    def __init__(self, lib, km: KernelMap, plan: CapturePlan, streaming: bool, dtypes: dict,
                 sync_device: tuple[int, int] | None = None, dynamic: bool = False, watch_table: int = -1):
        sites, offset = [], 0
        copy = native.COPY_DYNAMIC if dynamic else native.COPY
        self.dynamic = dynamic
        # a dynamic arena's layout rows: one per output of the copied sites, in site order
        self._first_rows: dict[int, tuple[int, int]] = {}  # site → (its first row, its outputs)
        self._layout_rows = 0
        self.slots: dict[int, tuple] = {}           # site → arena slots of its outputs
        self.untracked: dict[int, tuple[int, ...]] = {}
        for s in km.sites:
            action = 0 if not plan.wants_output(s.index) else EMIT if streaming else copy
            if action == native.COPY_DYNAMIC:
                self._first_rows[s.index] = (self._layout_rows, len(s.out_shapes))
                self._layout_rows += len(s.out_shapes)
            if action == COPY:
                slots, offset = native.layout(list(zip(s.out_shapes, s.out_dtypes)), offset)
                self.slots[s.index] = tuple(slots)
            else:  # shapes are only checked where copied; the count tells how many outputs
                slots = [native.Slot(-1, 0, d, tuple(shape)) for shape, d in zip(s.out_shapes, s.out_dtypes)]
            if s.index in plan.untracked_inputs:
                self.untracked[s.index] = tuple(j for j, a in enumerate(s.args) if a.kind == ArgKind.UNTRACKED)
            sites.append(native.NativeSite(s.symbol, s.returns_output, s.num_inputs, action,
                                           self.untracked.get(s.index, ()), tuple(slots)))
        # helpers lowering added, called a fixed number of times a run (kernel_map.fixed_helpers):
        # sites of the plan after the map's own, timed only, so that the instrument expects them
        for symbol, count in getattr(km, "fixed_helpers", {}).items():
            sites += [native.NativeSite(symbol, False, 0)] * count
        self.num_native_sites = len(sites)
        if self.slots and not offset:
            # every copied output is empty (a Slice past the end): still an arena, or the run
            # would hand over no outputs at all, and an empty tensor is a value like any other
            offset = native.ALIGN
        self.session = lib.open(native.encode_plan(sites, offset, sync_device=sync_device))
        if watch_table >= 0 and hasattr(lib, "watch_session"):  # (a remote session: the server's process)
            lib.watch_session(self.session.id, watch_table)
        self.instrument = self.session.instrument()
        self.own_arena = not lib.can_call_back  # remote: the session's own arena, downloaded
        self.callbacks, self.streaming = lib.can_call_back, streaming
        self.arena_bytes, self.dtypes = offset, dtypes
        self.sites = km.sites
        self.copied_sites = sorted(self.slots)
        # arenas made: [array, its reference count when only the pool holds it, address]
        self._pool: list[list] = []
        self._site_dtypes = {i: [dtypes[d] for d in km.sites[i].out_dtypes] for i in self._first_rows}
        self._small = Chunks(self._CHUNK)  # one-off arenas, cut from chunks

    def arena(self) -> tuple[np.ndarray | None, int]:
        """An arena no Capture or array of an earlier run still uses (so reusing it overwrites
        nothing anyone can read), and its address; a new one when all are held.  Reused memory
        is already paged in, which is what lets copies run at memcpy speed (fresh memory costs a
        page fault per 4 KiB).  (None, 0) when nothing is copied, or when the session copies
        into an arena of its own (remote, dynamic).

        """
        if not self.arena_bytes or self.own_arena:
            return None, 0
        pool = self._pool
        for entry in pool:
            if _references(entry[0]) == entry[1]:
                return entry[0], entry[2]
        if len(pool) >= self._POOL:  # all held (calls keep their captures): a one-off
            return self._small.take(self.arena_bytes)
        entry = [None, 0, 0]
        entry[0], entry[2] = aligned_bytes(self.arena_bytes)  # (arena offsets assume an aligned start)
        entry[1] = _references(entry[0])  # held by the pool's entry alone (measured as the check above does)
        pool.append(entry)
        return entry[0], entry[2]

    def keep_run(self, capture: Capture, arena: np.ndarray | None, timed_sites: list[int] | None,
                 arena_tensor=None) -> None:
        """The last run's outputs into ``capture`` (``arena``: the one :meth:`arena` gave it;
        ``arena_tensor``: the session's own, of that run), and its kernel times when
        ``timed_sites`` (the hooked sites) are given.

        A dynamic plan's outputs are views of the session's arena (``arena_tensor``, or the
        one of the session's last run) at the places and shapes the layout rows it starts with
        say, made when read; its times are in the same header.  So nothing is copied after such
        a run: the arena is the run's own until its holders let go (a few KiB allocated right
        after a VM run cost microseconds)."""
        times = None
        if self.dynamic:
            tensor = self.session.arena_tensor() if arena_tensor is None else arena_tensor
            if tensor is not None:
                outputs = capture.outputs = LayoutOutputs(tensor, self._header, self._first_rows, self._site_dtypes)
                times = outputs.times
        elif arena is not None or arena_tensor is not None:
            arena = np.from_dlpack(arena_tensor) if arena is None else arena
            capture.outputs = ArenaOutputs(arena, self.slots, self.dtypes)
        if timed_sites is not None:  # (a copy: the next run writes the session's buffer again)
            capture.timing = timed_sites, self.session.times.copy() if times is None else times

    def _header(self, arena: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return native.arena_header(arena, self._layout_rows, self.num_native_sites)

    def untracked_inputs(self, site: int, tensors) -> dict[int, np.ndarray]:
        """The inputs of ``site`` the plan keeps (handed over during a run), on the host, by
        argument position (a symbolic dimension's value, passed as an int, as it is)."""
        return dict(zip(self.untracked[site], [host_copy(t) for t in tensors]))


def _references(array: np.ndarray) -> int:
    """``array``'s reference count, measured the same way for the pool and its baseline."""
    return sys.getrefcount(array)


class NativeCalls(Observer):
    """One run under the native instrument: ``with calls:`` wraps the VM run (begin, then read
    the session's buffers back); :meth:`fetch` downloads what a remote session holds;
    :meth:`finish` fills the Capture.

    Ctrl-C needs no deferral here: the instrument lets Python's SIGINT handler run now and then,
    and a KeyboardInterrupt it raises stops the VM and reaches Python as itself.
    """

    def __init__(self, handle: ExecutorHandle, prepared: NativePlan, capture: Capture, sink):
        self.handle, self.prepared, self.capture, self.sink = handle, prepared, capture, sink
        self.failure: BaseException | None = None
        self.arena: np.ndarray | None = None
        self.stats: list[int] = []
        self._events = prepared.callbacks and (sink is not None or bool(prepared.untracked))

    def __enter__(self) -> "NativeCalls":
        prepared = self.prepared
        self.handle.install(prepared.instrument, key=prepared.session.id)
        self.arena, address = prepared.arena()
        prepared.session.begin(address, self.on_event if self._events else None)
        return self

    def __exit__(self, *_exc) -> None:
        session = self.prepared.session
        session.end()
        self.stats = session.stats.tolist()

    def on_event(self, kind: int, site: int, *tensors) -> None:
        """Python's part during the run: untracked inputs (0) and streamed outputs (1)."""
        try:
            if kind == 0:
                self.capture.untracked_inputs[site] = self.prepared.untracked_inputs(site, tensors)
            else:
                self.sink(site, [host_array(t) for t in tensors])
        except BaseException as err:
            self.failure = err
            raise

    def running_site(self) -> tuple[int | None, bool]:
        """The first kernel call that did not finish, and False: the instrument times calls when
        they end, so the VM may have raised in a builtin just before that call."""
        durations = self.prepared.session.times[1]
        if len(durations) != self.prepared.num_native_sites:  # a remote session that could not be read
            return None, False
        return next((s.index for s in self.prepared.sites
                     if not s.is_view and durations[s.index] != durations[s.index]), None), False

    def reraise(self) -> None:
        if self.failure is not None:
            raise self.failure from None
        if self.stats and self.stats[STOPPED]:
            raise TVMBehaviourChanged(f"{self.prepared.session.error()}; this TVM version behaves "
                                      "differently from the ones tvm_probe supports") from None

    def fetch(self) -> None:
        """Bring back what the session kept instead of handing it over during the run (a remote
        session: the arena of copied outputs, the untracked inputs); all of it, or an error."""
        prepared, session = self.prepared, self.prepared.session
        if session.times.shape[1] != prepared.num_native_sites:  # a remote session end() could not read
            raise TVMRunError("the capture session's times and counts could not be read back: nothing of this "
                              "run is kept")
        if prepared.own_arena and prepared.arena_bytes:
            self.arena = session.arena()
            got = -1 if self.arena is None else self.arena.nbytes
            if got != prepared.arena_bytes:
                raise TVMRunError(f"the capture session returned {max(got, 0)} bytes of kernel outputs where "
                                  f"{prepared.arena_bytes} were copied: nothing of this run is kept")
        if prepared.untracked and not self._events:
            durations = session.times[1]
            for site, positions in prepared.untracked.items():
                if site < len(durations) and durations[site] == durations[site]:  # called
                    kept = {j: session.kept(site, j) for j in positions}
                    self.capture.untracked_inputs[site] = {j: a for j, a in kept.items() if a is not None}

    def finish(self) -> None:
        prepared, capture, stats = self.prepared, self.capture, self.stats
        starts, durations = prepared.session.times.tolist()
        if stats[CALLED] == len(durations):  # the usual case: dicts made in C
            capture.start_us, capture.time_us = dict(enumerate(starts)), dict(enumerate(durations))
            copied = prepared.slots
        else:
            called = [i for i, d in enumerate(durations) if d == d]  # NaN: not called
            capture.start_us = {i: starts[i] for i in called}
            capture.time_us = {i: durations[i] for i in called}
            copied = {i: prepared.slots[i] for i in prepared.copied_sites if i in capture.time_us}
        capture.copied_bytes = stats[COPIED_BYTES]
        if self.arena is not None:
            capture.outputs = ArenaOutputs(self.arena, copied, prepared.dtypes)
        if stats[UNEXPECTED] or stats[CALLED] < len(durations):
            missing = [s for s in prepared.sites if s.index not in capture.time_us and not s.is_view]
            if stats[UNEXPECTED] or missing:
                raise behaviour_changed(prepared.session.unexpected(), missing)
        if self.sink is not None and not prepared.streaming:  # downloaded, now handed over in order
            for site in copied:
                self.sink(site, capture.outputs[site])


class HookedNativeCalls(NativeCalls):
    """One run through a VM whose observed kernels are native hooks
    (:mod:`tvm_probe.capture.kernel_hook`): the session of the plan (``prepared``, the VM's own
    for the plan) is the instrument's, pointed at by the VM's switch instead of installed as
    TVM's instrument; only the hooked kernels' calls are seen, counted and checked."""

    def __init__(self, handle: ExecutorHandle, prepared: NativePlan, capture: Capture, vm: HookedVM, timed: bool):
        # a plan that hands outputs over (symbolic shapes) stores them in the capture as they come
        super().__init__(handle, prepared, capture, capture.outputs.__setitem__ if prepared.streaming else None)
        self.vm = vm
        self.timed = timed  # kernel times kept (everything captured, or asked for)

    def call(self, function, args: list):
        """``function(*args)`` with the hooks reporting to the plan's session."""
        prepared = self.prepared
        self.arena, address = prepared.arena()
        try:
            return self.vm.switch.call(prepared.session, address, self.on_event if self._events else None,
                                       function, args)
        finally:
            self.stats = prepared.session.stats.tolist()

    def finish(self) -> None:
        """The hooked kernels were called as often as the kernel map has call sites for them
        (checked by count: a pass over every site costs more than a small model's run)."""
        prepared, capture, stats, sites = self.prepared, self.capture, self.stats, self.vm.hooked_sites
        if stats[UNEXPECTED] or stats[CALLED] != self.vm.expected_calls:
            capture.time_us = {i: d for i, d in enumerate(prepared.session.times[1].tolist()) if d == d}
            missing = [s for s in prepared.sites if s.index not in capture.time_us and s.symbol in self.vm.hooked
                       and not s.is_view]
            raise behaviour_changed(prepared.session.unexpected(), missing)
        capture.copied_bytes = stats[COPIED_BYTES]
        prepared.keep_run(capture, self.arena, sites if self.timed else None)
