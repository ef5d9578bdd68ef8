"""A VM of the deployed executable in which only the observed kernels are hooks.

TVM's instrument (``vm.set_instrument``) is called before and after *every* VM instruction,
builtins included: on a small model that dispatch alone costs a few percent of a run, whatever
the instrument does.  A run need not pay it.  The VM resolves each kernel name once, when it is
initialised (``vm_initialization``: the first import that has the name, else the global function
registry), so a VM whose imports are cleared before that takes every kernel from the registry —
where, for that moment, the observed kernels are hooks and all others are the compiled
functions themselves (a hooked VM builtin, a view or a KV cache's attention, is replaced in the
registry for that moment too).  The registrations are undone right after (the registry is
process-wide), and the VM keeps what it resolved.  The executable, its kernels and their order
are those of the deployed module: nothing is rebuilt.

Hooks are native (:class:`tvm_probe.capture.native.HookSwitch`: C++ wrappers doing the native
instrument's own bookkeeping for the session a run points them at) or, without the native
library, Python wrappers calling :attr:`HookedVM.observer` (a few kernels only).  A hook sees the
arguments of its kernel (destination-passing style: inputs, then outputs) and counts the calls
of its symbol, which is how the kernel map numbers call sites.  Only the host (CPU) is hooked
this way; the debug executor keeps the instrument everywhere else, and for a probe's first run,
which checks the call sequence against the kernel map.
"""
from __future__ import annotations

import threading
from typing import Callable, Iterable

import numpy as np

from ..core.errors import TVMBehaviourChanged
from ..kernel_map import ArgKind
from .observer import Observer
from .watch import BETWEEN, COPYING, flight

_REGISTERING = threading.RLock()  # the global registry is process-wide: one VM set up at a time


def registry_settled():
    """``with registry_settled():`` — make a VM while no hooked VM is being set up: a VM
    resolves VM builtins in the global registry, where for that moment a hooked view's builtin
    is a hook (another thread's VM would keep it)."""
    return _REGISTERING


class HookedVM:
    """The VM of ``executable`` on ``device`` with ``hooked`` kernel symbols wrapped.

    While a run lasts, :attr:`observer` ``(symbol, args, before)`` is called before and after
    each call of a hooked kernel, with the kernel's arguments.  Other kernels run as compiled,
    unobserved.
    """

    def __init__(self, executable, device, symbols: Iterable[str], hooked: Iterable[str], kernel_map,
                 switch=None):
        import tvm_ffi
        from tvm.runtime.vm import VirtualMachine

        self.hooked = frozenset(hooked)
        self.observer: Callable[[str, tuple, bool], None] = _ignore
        #: the native hooks' switch (:class:`tvm_probe.capture.native.HookSwitch`), or None: Python wrappers
        self.switch = switch
        #: the call sites of each hooked symbol, by occurrence
        self.sites_of = {symbol: [s for s in kernel_map.sites if s.symbol == symbol] for symbol in self.hooked}
        #: the indices of the call sites of hooked kernels (helpers lowering added have none)
        self.hooked_sites = [s.index for s in kernel_map.sites if s.symbol in self.hooked]
        self.prepared: dict = {}  # CapturePlan → its native session (tvm_probe.capture.native_driver.NativePlan)
        #: hooked kernel calls a run makes: at the call sites, and of the helpers called a fixed number of times
        self.expected_calls = len(self.hooked_sites) + sum(
            n for symbol, n in kernel_map.fixed_helpers.items() if symbol in self.hooked)
        self._functions: dict = {}
        runtime = executable.jit()
        module = runtime["vm_load_executable"]()
        library = module.imports[0] if module.imports else None
        # packed functions (relax.run.nonzero) live in the registry too, as the builtins do
        builtins = _builtins(set(symbols) | self.hooked) | {s.symbol for s in kernel_map.sites if s.packed}
        if builtins & self.hooked and switch is None:
            raise LookupError(f"VM builtins {sorted(builtins & self.hooked)[:3]} are hooked by native hooks only")
        compiled = {s: _compiled(library, s) for s in sorted((set(symbols) | self.hooked) - builtins)}
        # a hooked builtin (a view, the KV cache's attention) is the registry's own function: the
        # VM resolves builtins there too, so for the moment of set-up it finds the hook instead
        compiled.update({s: tvm_ffi.get_global_func(s, allow_missing=True) for s in sorted(builtins & self.hooked)})
        absent = [s for s, f in compiled.items() if f is None]
        if absent:
            raise LookupError(f"kernels {absent[:3]} are not in the executable's library")
        wrap = self._wrap if switch is None else switch.hook
        with _REGISTERING:
            previous = {s: tvm_ffi.get_global_func(s, allow_missing=True) for s in compiled}  # (not other builtins)
            try:
                for symbol, function in compiled.items():
                    kernel = wrap(symbol, function) if symbol in self.hooked else function
                    tvm_ffi.register_global_func(symbol, kernel, override=True)
                module.clear_imports()
                VirtualMachine._setup_device(_Shell(module), device, None)
            finally:
                for symbol, function in previous.items():
                    if function is None:
                        tvm_ffi.remove_global_func(symbol)
                    else:
                        tvm_ffi.register_global_func(symbol, function, override=True)
        self.module = module

    def _wrap(self, symbol: str, function):
        def kernel(*args):
            self.observer(symbol, args, True)
            function(*args)
            self.observer(symbol, args, False)

        return kernel

    def __getitem__(self, name: str):
        if name not in self._functions:
            self._functions[name] = self.module[name]
        return self._functions[name]


class _Shell:
    """What ``VirtualMachine._setup_device`` reads of a VM: its module."""

    def __init__(self, module):
        self.module = module


def _ignore(*_args) -> None:
    return None


def host_copy(arg):
    """A kernel argument as the cut module takes it again: a tensor copied to numpy, a scalar
    (a symbolic dimension's value, passed by the VM as an int) as it is."""
    return host_array(arg) if hasattr(arg, "numpy") else arg


def host_array(tensor) -> np.ndarray:
    """A copy of ``tensor`` in numpy: through DLPack for a host tensor (``Tensor.numpy()``
    costs ~5 us of Python, ~20 us in the middle of a run, with the caches cold), else as
    ``numpy()`` copies it (a device, a dtype numpy has no DLPack form for)."""
    try:
        return np.from_dlpack(tensor).copy()
    except Exception:
        return tensor.numpy()


def _builtins(symbols) -> set[str]:
    """The VM's own functions (``vm.builtin.*``): the VM finds them in the registry itself."""
    return {s for s in symbols if s.startswith("vm.builtin.")}


def _compiled(library, symbol: str):
    """The compiled kernel ``symbol`` of the executable's library, or None."""
    if library is None:
        return None
    try:
        return library.get_function(symbol)
    except AttributeError:
        return None


# ------------------------------------------------------------------------------ one run
#: ``Capture.instrument`` of a run through a :class:`HookedVM`.
HOOK = "kernel hook"
#: More kernel symbols than this to observe in Python: TVM's instrument (native) costs less overall.
MAX_HOOKED_SYMBOLS = 4


def hookable(kernel_map) -> bool:
    """Whether runs of this kernel map may go through a :class:`HookedVM` at all: not with
    calls inside control flow (which calls run changes between runs)."""
    branches = kernel_map.branches
    fixed = set(kernel_map.fixed_helpers)
    # helpers called a fixed number of times (shape functions lowering adds) are fine; symbolic
    # shapes too: without If the VM makes the same calls every run, only their sizes change
    return set(kernel_map.helper_symbols) <= fixed and not (
        branches is not None and (branches.occurrences or branches.open_symbols))


def symbols_to_hook(kernel_map, plan, native: bool = False, every: bool = False) -> frozenset[str] | None:
    """The kernel symbols a run of ``plan`` must observe, or None when the run needs the
    instrument.  ``every``: all of them (every kernel call timed).  Python wrappers observe few
    kernels, and no VM builtins (a view, the KV cache's attention); native hooks
    (:class:`tvm_probe.capture.native.HookSwitch`) any number, builtins included.  (Check
    :func:`hookable` first.)"""
    if every or plan.outputs is None:
        if not native:
            return None
        return frozenset(s.symbol for s in kernel_map.sites) | frozenset(kernel_map.fixed_helpers)
    sites = [kernel_map.sites[i] for i in plan.outputs | plan.untracked_inputs]
    symbols = frozenset(s.symbol for s in sites)
    if any(s.packed and s.num_outputs != 1 for s in sites):
        return None  # (a packed function returning a tuple: the hooks hand over single results only)
    if native:
        return symbols
    if any(s.returns_output or s.symbol.startswith("vm.builtin.") for s in sites):
        return None  # a view or a VM builtin (attention in a KV cache): not a kernel to wrap
    return symbols if len(symbols) <= MAX_HOOKED_SYMBOLS else None


class HookedRun(Observer):
    """What one run through a :class:`HookedVM` with Python wrappers copies: the outputs (and
    the untracked inputs) of the call sites ``plan`` wants, the hooked kernels' calls counted as
    the kernel map numbers them.  An :class:`~tvm_probe.capture.observer.Observer`: ``with run:``
    points the VM's wrappers at :meth:`on_call`; :meth:`finish` checks the counts."""

    def __init__(self, vm: HookedVM, plan, capture, sink=None, watch_table: int = -1):
        self.vm, self.plan, self.capture = vm, plan, capture
        self.store = sink or capture.outputs.__setitem__
        self.sites_of = vm.sites_of
        self.seen = dict.fromkeys(self.sites_of, 0)
        self.running: int | None = None
        self.flight, self.table = flight(), watch_table  # a watched process's in-flight record

    def __enter__(self) -> "HookedRun":
        self.vm.observer = self.on_call
        return self

    def __exit__(self, *_exc) -> None:
        self.vm.observer = _ignore

    def on_call(self, symbol: str, args: tuple, before: bool) -> None:
        """A hooked kernel's call, before and after it: count it, copy what the plan wants."""
        sites = self.sites_of[symbol]
        if before:
            occurrence = self.seen[symbol]
            self.seen[symbol] = occurrence + 1
            if occurrence >= len(sites):
                return
            site = sites[occurrence]
            self.running = site.index
            if site.index in self.plan.untracked_inputs:
                self.capture.untracked_inputs[site.index] = {
                    j: host_copy(args[j]) for j, a in enumerate(site.args) if a.kind == ArgKind.UNTRACKED}
            if self.flight is not None:
                self.flight.kernel(self.table, site.index)
            return
        self.running = None
        occurrence = self.seen[symbol] - 1
        if self.flight is not None and occurrence < len(sites):
            self.flight.state(COPYING)
        if occurrence < len(sites) and self.plan.wants_output(sites[occurrence].index):
            site = sites[occurrence]
            self.store(site.index, [host_array(o) for o in args[site.num_inputs: site.num_inputs + site.num_outputs]])
        if self.flight is not None and occurrence < len(sites):
            self.flight.state(BETWEEN)

    def reraise(self) -> None:
        """(Nothing to raise: an observer's exception reaches the VM's caller as itself.)"""

    def finish(self) -> None:
        """The hooked kernels ran as often as the kernel map has call sites for them."""
        off = {s: n for s, n in self.seen.items() if n != len(self.sites_of[s])}
        if off:
            raise TVMBehaviourChanged(
                "the VM called " + ", ".join(f"{s} {n} times (the kernel map has {len(self.sites_of[s])} call sites)"
                                             for s, n in off.items()) + ": please report this with the model")
