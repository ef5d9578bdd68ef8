"""Your own instrument: watch every kernel call of a run as it happens, in source terms.

TVM's hook (``vm.set_instrument``) sees a kernel symbol and raw tensors; tvm_probe's debug
executor already knows, for every call, its call site and the source values it computes.  An
:class:`Instrument` gets that per call, on top of what the run captures::

    class NaNWatch(Instrument):
        def reset(self):
            self.first = None
        def after_call(self, call):
            if self.first is None and any(np.isnan(a).any() for a in call.output_arrays()):
                self.first = call.names

    watch = NaNWatch()
    probe.run(inputs, capture=None, instrument=watch)
    watch.first                  # the source names of the first kernel that produced a NaN

The same hook as MLC-LLM's debug instrument (a class with ``reset()``), but each call arrives
with its source names, and fused kernels are told apart by call site, not by symbol.  A run
with an instrument uses the Python capture path (the native one cannot call back into Python),
so it costs more per kernel call than a plain capture.  Tensors are only valid during the
callback (TVM's memory planner reuses them): copy what you keep (``output_arrays()`` copies).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["Instrument", "KernelCall"]


@dataclass
class KernelCall:
    """One kernel call of a run, as an :class:`Instrument` sees it.

    Attributes:
        site: the call site (``probe.nodes`` row ``num_inputs + site``).
        symbol: the kernel TVM calls (``fused_matmul_add3``); ``occurrence``: its how-manieth call.
        names: the source names of what it outputs (one list per output).
        interior: the source names it keeps inside (fused away; recomputed on demand).
        inputs: its input tensors (``tvm.runtime.Tensor``; valid during the callback).
        outputs: its output tensors, in :meth:`Instrument.after_call` only.
        time_us: the call's time, in :meth:`Instrument.after_call` only.
    """

    site: int
    symbol: str
    occurrence: int
    names: list[list[str]]
    interior: list[str]
    inputs: list[Any]
    outputs: list[Any] = field(default_factory=list)
    time_us: float | None = None

    def input_arrays(self) -> list[np.ndarray]:
        """Copies of the tensor inputs as numpy arrays (non-tensor arguments left out)."""
        return [t.numpy() for t in self.inputs if hasattr(t, "numpy")]

    def output_arrays(self) -> list[np.ndarray]:
        """Copies of the outputs as numpy arrays."""
        return [t.numpy() for t in self.outputs]


class Instrument:
    """Override what you need; every method does nothing by default.

    An exception raised here stops the run and reaches the caller of ``run`` unchanged.
    """

    def reset(self) -> None:
        """Called once before every run (forget the previous run's state here)."""

    def before_call(self, call: KernelCall) -> None:
        """Called before each kernel call: ``call.inputs`` hold what it reads."""

    def after_call(self, call: KernelCall) -> None:
        """Called after each kernel call: ``call.outputs`` hold what it wrote."""
