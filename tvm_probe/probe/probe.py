"""The Probe: import → compile → map → run → serve values by source name.

    probe = Probe.from_onnx("bert.onnx", target="llvm", pipeline="fused")
    probe.run({"input_ids": ids, "attention_mask": mask})
    probe.get("layer_._0/attention/self/MatMul")
"""
from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Mapping, Sequence, Union

import numpy as np

from ..build.compile import BuiltModel
from ..capture.executor import Capture, CapturePlanner, DebugExecutor
from ..capture.plan import CapturePlan
from ..capture.weights_only import WeightsOnly
from ..core.device import device_label
from ..core.errors import InputError, NotRunError, ProbeError, UnknownNameError
from ..core.inputs import InputChecker
from ..core.results import NodeInfo, Results
from ..core.viewable import Viewable
from ..importer import ImportedModel, InputSpec
from ..importer.relax import FunctionModel, place_arguments, replace_held
from ..kernel_map import KernelMap, PlaceKind, classify
from ..store.assemble import DumpOptions, dump_calls, dump_probe, run_streaming
from .calls import CallArguments, CallLog, CallRecord, compare_call, compare_named
from .construct import Constructors
from .functions import BuiltFunctions, KVCaches
from .generate import generate, value_at_step
from .nodes import show_run, static_nodes
from .serving import ValueServer, join_build
from .verify import verify

log = logging.getLogger(__name__)

CaptureSpec = Union[str, Sequence[str], None]


class Probe(Constructors, Results, Viewable):
    """A compiled model whose every intermediate value can be read by its source name.

    Build one with :meth:`from_onnx` (or another ``from_*``: :mod:`.construct`); call :meth:`run`
    once per input; then :meth:`get`, :meth:`get_all`, :meth:`get_node_output`, :attr:`sources`,
    :attr:`nodes`, :meth:`dump`.  The executable that runs is exactly what
    ``tvm.compile(mod, target, pipeline)`` builds.

    ``remote=`` runs it on a remote device over TVM RPC (see :mod:`tvm_probe.capture.remote`): the
    executable is uploaded once, every run brings its captures back, and everything else
    (``get``, dumps, reports) is the same.
    """

    #: How the module was converted to reduced precision (a :class:`tvm_probe.tools.precision.Lowered`), or None.
    precision = None
    #: For a probe made by :meth:`from_hf`: its model, cache layout and generations
    #: (:class:`tvm_probe.importer.hf.HFModel`); None otherwise.
    hf = None
    serving: dict = {}  #: from_nn: its config's serving sizes (``context_window_size``...: :meth:`generate`)
    _generations = None

    def __init__(self, imported: ImportedModel, built: BuiltModel, kernel_map: KernelMap, remote=None,
                 precision=None):
        """``precision``: the :class:`~tvm_probe.tools.precision.Lowered` record of a model lowered before
        ``built`` was compiled (what :meth:`from_imported` makes with ``precision=``)."""
        self.imported, self.built, self.kernel_map = imported, built, kernel_map
        self._executor = DebugExecutor(built, kernel_map, sources=imported.sources, remote=remote,
                                       function=getattr(imported, "function", "main"))
        self._recomputer = self._executor.recomputer([s.group for s in kernel_map.sites if s.group is not None])
        self._capture: Capture | None = None
        self._wanted: set[str] | None = None
        self._values: dict[str, np.ndarray] = {}
        self._folded: dict[str, np.ndarray] = {}
        # how each value is served is this build's own table: the imported model is not touched,
        # so several probes (pipelines, targets) can share one import
        servings = classify(imported.sources, kernel_map, self.num_input_nodes)
        if isinstance(imported, FunctionModel):  # a function of a Relax module: arguments by position
            place_arguments(imported, kernel_map, servings)
        self._server = ValueServer(imported, built, kernel_map, servings, self._recomputer)
        self._functions: dict[str, "Probe"] = {self.function: self}
        self._calls = CallLog()
        self._serve_run = True  # get() without call=: the last run() (else the last call())
        self._init_results(imported.sources, servings, static_nodes(imported.inputs, imported.sources,
                                                                    kernel_map.sites))
        self._planner = CapturePlanner(kernel_map, self._names)
        self._check_inputs = InputChecker(imported.inputs)
        self._arguments: CallArguments | None = None  # call(): made at the first call
        # call(function, capture, kernel_times) → (probe, plan, wanted, every kernel timed, KV caches to read)
        self._fast_calls: dict[tuple, tuple] = {}
        self._call_plans: dict = {}  # call(): capture selection → _call_plan()
        self._weights: WeightsOnly | None = None  # call() of everything: outputs of the weights alone
        self._kv: KVCaches | None = None  # call(): the paged KV caches of this function, found at the first call
        self._timed_by: Capture | None = None  # the capture whose times (and sizes) the nodes show
        self._symbolic = any(isinstance(d, str) for n in self.node_infos for shape in n.out_shapes for d in shape)
        if precision is not None:
            self.precision = precision
            kernel_map.lost.update(precision.dropped)  # why a value the pass dropped is unknown
            precision.check(self)

    # -- construction (the constructors are construct.py's) --------------------------------------
    @staticmethod
    def serving_functions(probes: Mapping[str, "Probe"], hf=None, executable: BuiltFunctions | None = None,
                          serving: Mapping[str, int] | None = None) -> "Probe":
        """The first of ``probes`` (one per function of one build, by name) made to serve them
        all: every function runs in its VM, :meth:`call` reaches each by name; ``hf``: what
        :meth:`generate` needs of a transformers causal LM (:meth:`from_hf`); ``executable``: what
        the pipeline did to the imported functions (asking for one it renamed or removed says so);
        ``serving``: the nn model's serving config (:attr:`serving`)."""
        first, *rest = probes.values()
        for probe in rest:
            probe._executor.share_vm(first._executor)
        first._functions = _Functions(probes)
        first._functions.executable = executable
        if hf is not None:
            first.hf = hf
        first.serving = dict(serving or {})
        return first

    def generate(self, input_ids, steps: int, capture: CaptureSpec = "all", kv_cache: Mapping | None = None
                 ) -> list[int]:
        """``steps`` new token ids, greedy, from the compiled executable: a :meth:`from_hf` probe,
        or a :meth:`from_nn` model with MLC-LLM's functions (``embed``, ``prefill``, ``decode``, a
        KV cache creator), driven as MLC's runtime drives them (:mod:`tvm_probe.probe.generate`).
        ``probe.generations[-1]`` says which call gave which token; ``get(name, step=k)`` reads
        step ``k`` (0: the prefill).  ``kv_cache``: the creator's arguments by name
        (``max_total_seq_len``...), over those the model's config gives (:attr:`serving`)."""
        return generate(self, input_ids, steps, capture, kv_cache)

    @property
    def generations(self) -> list:
        """Every :meth:`generate` of this probe, in order (:class:`~tvm_probe.probe.generate.Generation`)."""
        if self.hf is not None:
            return self.hf.generations
        self._generations = self._generations or []
        return self._generations

    # -- multi-function executables ------------------------------------------------------------
    @property
    def function(self) -> str:
        """The VM function this probe's :meth:`run` calls (``"main"`` for imported models)."""
        return getattr(self.imported, "function", "main")

    @property
    def functions(self) -> dict[str, "Probe"]:
        """Function name → the probe of that function (this one among them): the functions of
        the executable as built (a pipeline may have renamed, added or removed some; looking up
        one it renamed or removed says what became of it)."""
        found = _Functions(self._functions)
        found.executable = getattr(self._functions, "executable", None)
        return found

    @property
    def vm(self):
        """The Relax VM every function runs in (for builtins around calls, e.g. a KV cache's)."""
        return self._executor.vm

    def call(self, function: str, *args, capture: CaptureSpec = "all", kernel_times: bool | None = None):
        """Run one function of the executable and capture it (every call is numbered from 0).

        Args:
            function: the VM function (see :attr:`functions`).
            args: the arguments the compiled function takes, but the weights the probe holds
                (``params=``): numpy arrays (checked, copied to the device) or anything the VM
                takes as it is — tensors, a KV cache, ``ShapeTuple``, tuples and lists.
            capture: as for :meth:`run` (names resolve within ``function``).
            kernel_times: as for :meth:`run` (None: per-kernel times unless few kernels are wanted).

        Returns:
            What ``vm[function](*args)`` returns, as it returns it.
        """
        key = (function, capture if capture is None or type(capture) is str else tuple(capture), kernel_times)
        fast = self._fast_calls.get(key)
        if fast is not None:  # a call made before: what was decided then holds (a decode loop)
            probe, plan, wanted, every, layouts, weights, direct = fast
            ran = direct(args) if direct else None  # the whole call in one native call (False: never)
            if ran is not None:
                kv = KVCaches.read(args, layouts) if layouts else None  # (before the next call: see _direct)
                if type(ran) is tuple:  # (its record's Capture is made when read)
                    self._serve_run = False
                    self._calls.add_direct(function, wanted, direct, args, ran[1], kv)
                    return ran[0]
                self._record_call(function, ran, wanted).kv = kv
                return _hand_over(ran)
            if weights is not None:  # (once served, the weights-only outputs are not copied)
                plan, every = weights.next_run(every)
            run, arguments = probe._executor.fast_calls.get((plan, every)), probe._arguments.as_passed(args)
            if run is not None and arguments is not None:
                result = run(arguments, probe._arguments.arrays_at)
                if weights is not None:
                    weights.took(self.num_calls, result, plan)
                    if direct is None and plan is weights.reduced:  # served from now on: one native call
                        direct = probe._direct(run, args, weights, layouts) or False
                        self._fast_calls[key] = probe, fast[1], wanted, fast[3], layouts, weights, direct
                record = self._record_call(function, result, wanted)
                if layouts:  # what the KV caches hold after this call (it changes with the next)
                    record.kv = KVCaches.read(arguments, layouts)
                return _hand_over(result)
        probe = self._functions.get(function) or self._function_probe(function)
        if probe._arguments is None:
            probe._arguments = CallArguments(probe.imported, function)
        arrays = probe._arguments(args)
        layouts, plan, wanted = probe._call_plan(capture)
        if self._calls.last is not None and self._calls.last.function != function:
            probe._executor.forget_instrument()  # the VM holds the other function's instrument
        weights, every = probe._weights_only(plan, wanted), bool(kernel_times)
        run_plan, run_every = weights.next_run(every) if weights is not None else (plan, every)
        result = probe._executor.run(arrays, run_plan, raw=True, kernel_times=run_every or kernel_times,
                                     arrays_at=probe._arguments.arrays_at)
        if weights is not None:
            weights.took(self.num_calls, result, run_plan)
        run = probe._executor.fast_call(run_plan, run_every)
        if run is not None:  # (the plan asked for: set_params may go back to it)
            direct = probe._direct(run, args, weights, layouts)
            self._fast_calls[key] = probe, plan, wanted, every, layouts, weights, direct
        record = self._record_call(function, result, wanted)
        if layouts:  # what the KV caches hold after this call (it changes with the next)
            record.kv = KVCaches.read(arrays, layouts)
        return _hand_over(result)

    def _direct(self, run, args: tuple, weights, layouts):
        """``run`` (a :class:`~tvm_probe.capture.fast_call.FastCall`) for later calls passing
        arguments of the types of ``args``, in one native call each (of everything: once ``weights``
        serves the weights-only outputs); None where the calls need Python's path."""
        if weights is not None and (weights.served is None or run.plan is not weights.reduced):
            return None
        held = getattr(self.imported, "held", {})
        if layouts and any(p <= layout.param for p in held for layout in layouts):
            return None  # (a cache after a held weight: the caller's arguments are not at its position)
        arguments = self._arguments.prepared(args)
        if arguments is None:
            return None
        return run.direct(self._arguments.template.copy(), arguments, tuple(map(type, args)), weights)

    def set_params(self, values: Mapping[str, np.ndarray]) -> None:
        """Replace weights the probe holds, by parameter name, in every function that takes them
        (``params=`` of :meth:`from_relax` / :meth:`from_nn`; ``<path>.q_weight`` and friends of
        :meth:`from_hf` with ``quantize=``): the executable is not rebuilt.  The captures of
        earlier calls are forgotten (they ran with the weights replaced).  A name no function
        holds, or a shape or dtype other than the parameter's, is refused in one line."""
        import tvm

        held = {name for p in self._functions.values() for i, (name, _) in enumerate(p.imported.params)
                if i in getattr(p.imported, "held", {})}
        unknown = sorted(set(values) - held)
        if unknown:
            raise ProbeError(f"set_params: the probe holds no weight {', '.join(unknown[:4])}; it holds "
                             f"{', '.join(sorted(held)[:6])}{'...' if len(held) > 6 else ''}")
        device = self.built.device
        host = {name: np.asarray(v, order="C") for name, v in values.items()}
        tensors = {name: (tvm.runtime.tensor(a, device), a) for name, a in host.items()}
        for probe in self._functions.values():
            for i, tensor in replace_held(probe.imported, tensors).items():
                if probe._arguments is not None:  # the arguments template of call()'s fast path
                    probe._arguments.template[i] = tensor
        self._fast_calls.clear()  # (its native calls hold the weights they were made with)
        for probe in self._functions.values():  # what the old weights computed is served no more
            if probe._weights is not None:
                probe._weights.reset()
        self.forget_calls()

    def _record_call(self, function: str, result: Capture, wanted) -> CallRecord:
        """The next call's record, kept; ``get`` without ``call=`` serves it from now on."""
        self._serve_run = False
        return self._calls.add(function, result, wanted)

    @property
    def kv_layouts(self) -> list:
        """The paged KV caches this function attends with (:class:`tvm_probe.importer.kv_cache.CacheLayout`)."""
        return self._kv_caches().layouts

    def _kv_caches(self) -> KVCaches:
        if self._kv is None:
            self._kv = KVCaches(self.imported.mod["main"])
        return self._kv

    def _weights_only(self, plan: CapturePlan, wanted) -> WeightsOnly | None:
        """This function's :class:`~tvm_probe.capture.weights_only.WeightsOnly` for a call of
        everything (``plan``, ``wanted`` None), made at its first; None for other selections."""
        if wanted is not None or plan.outputs is not None:
            return None
        if self._weights is None or self._weights.everything is not plan:
            self._weights = WeightsOnly(self.kernel_map, getattr(self.imported, "held", {}), plan)
        return self._weights

    def provenance(self, name: str, call: int | None = None) -> str:
        """Where the value of ``name`` in call ``call`` (default: the last) comes from: that call's
        own capture, or — for a kernel output computed from the weights alone, once two calls
        captured it alike — the capture of the call that first did (see
        :mod:`tvm_probe.capture.weights_only`).  How it is served otherwise: :meth:`served`."""
        record = self.call_record(call)
        probe = self._function_probe(record.function)
        key = probe.resolve(name)
        place, weights = probe.kernel_map.places.get(key), probe._weights
        found = weights.provenance(place.site, record.capture) if weights is not None and place is not None \
            and place.site is not None and place.site >= 0 else None
        if found is not None:
            return found
        number = call if call is not None and call >= 0 else self.num_calls + (call if call is not None else -1)
        return f"{probe.served(key).value} at call {number}"

    def _call_plan(self, capture: CaptureSpec) -> tuple:
        """``(KV caches to read after the call, CapturePlan, wanted keys)`` for ``capture``, made
        once per selection (a decode loop asks for the same one at every step)."""
        key = capture if capture is None or isinstance(capture, str) else tuple(capture)
        planned = self._call_plans.get(key)
        if planned is None:
            layouts, rest = self._kv_caches().split(capture)
            if len(self._call_plans) >= 64:
                self._call_plans.clear()
            planned = self._call_plans[key] = (layouts, *self._planner.plan(rest))
        return planned

    @property
    def calls(self):
        """DataFrame: one row per :meth:`call` — call, function, time_us, captured_bytes."""
        return self._calls.frame()

    @property
    def num_calls(self) -> int:
        """How many :meth:`call` s were made (forgotten ones included): the last call is number
        ``num_calls - 1``."""
        return len(self._calls)

    @property
    def call_records(self) -> tuple[CallRecord, ...]:
        """Every :meth:`call`'s :class:`~tvm_probe.probe.calls.CallRecord`, in call order; those
        dropped by :meth:`forget_calls` have ``capture=None`` (:meth:`call_record` refuses them)."""
        return tuple(self._calls.records)

    def forget_calls(self, keep_last: int = 0) -> None:
        """Drop the captures of all calls but the last ``keep_last`` (every call keeps what it
        captured until then: a long generation grows by one capture per step).  Calls keep
        their numbers."""
        self._calls.forget(keep_last)

    def call_record(self, call: int | None = None) -> CallRecord:
        """Call ``call`` (default: the last one), or a one-line error."""
        return self._calls.at(call)

    def in_call(self, call: int | None = None):
        """``with probe.in_call(k) as p:`` — ``p`` (the function's probe) serves call ``k``."""
        record = self.call_record(call)
        return self._function_probe(record.function).serving_call(record)

    @contextlib.contextmanager
    def serving_call(self, record: CallRecord):
        """``with p.serving_call(record):`` — this probe (the function probe of ``record``)
        serves that call's values while the block runs: its nodes take that call's times (and
        sizes, for symbolic shapes), values recomputed meanwhile stay with the record; what it
        served before comes back after."""
        saved = self._capture, self._wanted, self._values
        if saved[0] is not record.capture:
            self._accept(record.capture, record.wanted)
        self._values = record.values if record.values is not None else {}
        try:
            yield self
        finally:
            record.values = self._values
            if saved[0] is not record.capture:
                if saved[0] is not None:
                    self._accept(saved[0], saved[1])
                self._capture, self._wanted, self._values = saved

    def get(self, name: str, call: int | None = None, step: int | None = None) -> np.ndarray:
        """The value of ``name``: in the last :meth:`run`, or in call ``call`` of :meth:`call`
        (default: the last call, when a call came after the last run).  Names resolve within
        the function that call ran.  Before any :meth:`call`, the last run is call 0.

        ``step``: in step ``step`` of the last :meth:`generate` (0: the prefill), whichever of the
        step's calls computes it (an MLC-style model's ``embed`` call holds ``model.embed_tokens``;
        its ``prefill``/``decode`` call the rest)."""
        if step is not None:
            if call is not None:
                raise InputError(f"get({name!r}, call={call}, step={step}): give call= or step=, not both")
            return value_at_step(self, name, step)
        if self._serves_run(call):
            return super().get(name)
        record = self.call_record(call)
        if record.kv is not None and name in record.kv:
            return record.kv[name]
        with self.in_call(call) as probe:
            return Results.get(probe, name)

    def _serves_run(self, call: int | None) -> bool:
        """Whether ``call`` asks for the last run: no call given after a run, or call 0 (-1) of a
        probe that has run but never been called (its run is its ``main``'s one call)."""
        if not self._serve_run:
            return False
        return call is None or (call in (0, -1) and self.num_calls == 0 and self._capture is not None)

    def get_all(self, pattern: str, call: int | None = None) -> dict[str, np.ndarray]:
        """Every value matching ``pattern`` (see :meth:`get` for ``call``)."""
        if self._serves_run(call):
            return super().get_all(pattern)
        with self.in_call(call) as probe:
            return Results.get_all(probe, pattern)

    def compare(self, reference, call: int | None = None, name_map: Mapping[str, str] | None = None,
                atol: float | None = None, rtol: float | None = None):
        """Compare the values ``reference`` names (``{name: array}``, e.g. from onnxruntime or
        PyTorch forward hooks, by module path) with the last :meth:`run`, or with call ``call``
        (see :meth:`get`); ``name_map`` maps reference names to this model's where the two
        models' paths differ.  Returns a :class:`~tvm_probe.comparison.Comparison`.
        :func:`tvm_probe.probe.calls.compare_calls` does several calls at once (a report per call)."""
        if self._serves_run(call):
            return compare_named(self, reference, name_map, atol, rtol)
        return compare_call(self, reference, call, name_map, atol, rtol)

    def _function_probe(self, function: str) -> "Probe":
        return self.functions[function]

    @property
    def import_fixes(self) -> list:
        return list(getattr(self.imported, "fixes", []))

    @property
    def compile_warnings(self) -> list:
        return list(self.built.warnings)

    @property
    def model_hash(self) -> str:
        """sha256 of the source model (what dumps record to tie themselves to it)."""
        return self.imported.model_hash

    @property
    def captured_keys(self) -> set[str] | None:
        """Keys the last run was asked to capture (``run(capture=[...])``); None: everything."""
        return None if self._wanted is None else set(self._wanted)

    @property
    def inputs(self) -> list[InputSpec]:
        """The inputs :meth:`run` takes: name, shape, dtype."""
        return list(self.imported.inputs)

    @property
    def last_run_us(self) -> float | None:
        """Wall time of the last :meth:`run` of the executable, in microseconds."""
        return self._capture.total_us if self._capture is not None else None

    @property
    def last_transfer_us(self) -> dict[str, dict[str, float]] | None:
        """Microseconds the last :meth:`run` spent moving each model input to the device
        (``"inputs"``) and each model output back (``"outputs"``, a sequence's elements
        together), by name; None before a run."""
        if self._capture is None:
            return None
        outputs = self.imported.sources.output_values(self._capture.output_us)
        return {"inputs": dict(zip((s.name for s in self.imported.inputs), self._capture.input_us)),
                "outputs": {k: sum(t) if isinstance(t, list) else t for k, t in outputs.items()}}

    @property
    def remote(self) -> str | None:
        """Where the model runs when it runs remotely (``host:port``, or the tracker and key)."""
        return self._executor.remote.where if self._executor.remote is not None else None

    @property
    def instrument(self) -> str | None:
        """Which capture instrument ran the last :meth:`run`: ``"native"`` (C++, see
        :mod:`tvm_probe.capture.native`) or ``"python"``; None before the first run.  Also in
        ``probe.nodes.attrs["instrument"]``."""
        return self._capture.instrument if self._capture is not None else None

    @property
    def last_inputs(self) -> list[np.ndarray]:
        """The inputs of the last :meth:`run`, in :attr:`inputs` order."""
        return self._require_run().inputs

    @property
    def last_capture(self) -> Capture:
        """What the run values are served from copied (a :class:`~tvm_probe.capture.Capture`:
        inputs, kernel outputs by call site, times); NotRunError before a run."""
        return self._require_run()

    def verify(self, inputs):
        """Check every value this probe serves against an independent, unfused evaluation.

        Runs the model on ``inputs`` (capturing everything), builds the imported module again
        without FoldConstant and FuseOps and compares each served value with the one that build
        computes.  A mismatch is a tvm_probe problem (please report it), not a TVM divergence.
        Costs about one extra compile and one unfused run.

        The probe's last run is left as it was: ``get`` still answers for the run before.

        Returns:
            A :class:`~tvm_probe.probe.verify.Verification`, truthy when nothing disagreed;
            ``.summary()`` is one line.
        """
        saved = {name: getattr(self, name) for name in _RUN_STATE if hasattr(self, name)}
        saved = {name: (value.copy() if isinstance(value, (dict, list, set, CallLog)) else value)
                 for name, value in saved.items()}
        try:
            return verify(self, inputs)
        finally:
            for name, value in saved.items():
                setattr(self, name, value)

    @property
    def pipeline(self) -> str:
        return self.built.pipeline

    @property
    def num_input_nodes(self) -> int:
        return len(self.imported.inputs)

    # -- running ------------------------------------------------------------------------------
    def run(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None,
            capture: CaptureSpec = "all", stream_to=None, allow_nonfinite: bool = False,
            kernel_times: bool | None = None, instrument=None, **dump_options) -> dict[str, np.ndarray]:
        """Run the deployed executable once and capture intermediate values.

        Args:
            inputs: ``{input name: array}``, a list in :attr:`inputs` order, or one array for
                a model with one input.
            capture: ``"all"``; a name, pattern or list of them (then only what those values
                need is copied: their kernel outputs, or the inputs of the kernels that keep
                them inside); or ``None`` for no capture at all.
            kernel_times: time every kernel call (``probe.nodes["time_us"]``).  By default (None)
                every call is timed in a probe's first run (through TVM's instrument, which checks
                the call sequence) and in runs capturing everything; a run capturing nothing or a
                selection observes only the selected kernels and times nothing, which costs a
                plain run almost nothing (see :mod:`tvm_probe.capture.kernel_hook`).  True times every
                call; False never asks for it.
            instrument: your own :class:`~tvm_probe.capture.instrument.Instrument`, called around
                every kernel call with its call site and source names.
            stream_to: a dump folder: each copied tensor is written there as soon as the
                kernel produced it, so peak memory stays near the model's own; the dump is
                complete (same format as :meth:`dump`) when ``run`` returns, and later
                ``get`` calls read from it.
            allow_nonfinite: accept inputs holding NaN or Inf (refused by default: usually a
                data bug; allow them to trace how they propagate).
            dump_options: with ``stream_to``, the options of :meth:`dump` (``overwrite``,
                ``include_weights``, ``recomputed``, ``timings``, ``metadata``).

        Returns:
            The model outputs, by output tensor name (a sequence output as a list of arrays, its
            elements in order, as plain TVM returns it as a tuple).
        """
        if len(self._functions) > 1 or isinstance(self.imported, FunctionModel):
            self._check_runnable()
        arrays = self._check_inputs(inputs, allow_nonfinite)
        plan, wanted = self._planner.plan(capture)
        if dump_options and stream_to is None:
            raise TypeError(f"run() got dump options {sorted(dump_options)} without stream_to")
        # Values kept inside fused kernels will be recomputed from this run: build their cut
        # modules meanwhile (once per probe) instead of on the first read.
        build = self._recomputer.build_alongside() if self._planner.recomputes(wanted) else None
        try:
            if stream_to is not None:
                run_streaming(self, arrays, plan, Path(stream_to), DumpOptions(**dump_options),
                              execute=lambda sink: self._executor.run(arrays, plan, sink=sink),
                              serve=lambda capture: self._accept(capture, wanted))
            else:
                self._accept(self._executor.run(arrays, plan, kernel_times=kernel_times, observer=instrument), wanted)
            self._serve_run = True
        finally:
            if build is not None:
                join_build(build)
        return self.imported.sources.output_values(self._capture.result)

    def _check_runnable(self) -> None:
        """run() feeds arrays to ``main``; a function taking objects or held weights needs call()."""
        if len(self._functions) > 1:
            raise ProbeError(f"this executable has {len(self._functions)} functions "
                             f"({', '.join(self._functions)}): run one with probe.call(function, *args)")
        if self.imported.held or any(s.dtype in ("object", "tuple", "shape", "prim") for s in self.imported.inputs):
            raise ProbeError(f"{self.function}() takes held weights or non-tensor arguments: use "
                             f"probe.call({self.function!r}, *args)")

    def _accept(self, capture: Capture, wanted: set[str] | None) -> None:
        """Make ``capture`` (which copied what ``wanted`` needs) the run values are served from.

        Only a run that completed gets here: a failed one leaves the previous run in place.
        The nodes take the run's times (and sizes) when they are next read (:attr:`node_infos`):
        a run of a small model cannot afford a pass over every node.
        """
        self._capture, self._wanted, self._values = capture, wanted, {}

    @property
    def node_infos(self) -> list[NodeInfo]:
        """The graph nodes, with the times (and, for symbolic shapes, the sizes) of the run
        values are served from."""
        capture = self._capture
        if capture is not self._timed_by and capture is not None:
            self._show_run(capture)
        return self._nodes

    @node_infos.setter
    def node_infos(self, nodes: list[NodeInfo]) -> None:
        self._nodes, self._timed_by = nodes, None

    def _show_run(self, capture: Capture) -> None:
        previous, self._timed_by = self._timed_by, capture
        show_run(self._nodes, self.num_input_nodes, capture, previous, self.kernel_map.sites, self._symbolic)

    # -- serving values -----------------------------------------------------------------------
    def _require_run(self) -> Capture:
        if self._capture is None:
            raise NotRunError("the model has not run yet: call probe.run(inputs) before reading values")
        return self._capture

    def _value(self, key: str) -> np.ndarray:
        return self._server.value(key, self._require_run(), self._values, self._folded)

    def serve_many(self, keys: list[str]) -> list:
        if self._capture is None:  # (each key gets the one-line "not run yet")
            return super().serve_many(keys)
        return self._server.values(keys, self._capture, self._values, self._folded)

    def values_kept_inside(self, site, key: str) -> dict[str, np.ndarray]:
        """Every source value the fused call site ``site`` keeps inside, by key, recomputed at
        once from the inputs it received in the last run (``key``, the value asked for, names
        it in errors).  Not cached: :meth:`get` caches; a streamed dump holds one site at a time."""
        return self._server.kept_inside(self._require_run(), site, key)

    def can_recompute(self, site) -> bool:
        """Whether the last run kept every input of the call site ``site``, so that what it
        keeps inside can be recomputed (:meth:`values_kept_inside`) without an error."""
        return self._server.can_recompute(self._require_run(), site)

    def _node_output(self, index: int, output: int) -> np.ndarray:
        capture = self._require_run()
        if index < self.num_input_nodes:
            return capture.inputs[index]
        node = self.node_infos[index]
        return self._server.site_output(capture, index - self.num_input_nodes, output, node.name)

    def built_dtype(self, key: str) -> str | None:
        """The dtype the compiled kernels compute source value ``key`` in: a kernel's output or a
        value a fused kernel keeps inside; None for any other (an input, a constant, folded)."""
        place = self.kernel_map.places.get(key)
        if place is None:
            return None
        if place.kind is PlaceKind.OUTPUT:
            return self.kernel_map.sites[place.site].out_dtypes[place.output]
        if place.kind is PlaceKind.INTERIOR:
            return str(getattr(place.inner.ty, "dtype", ""))
        return None

    # -- dumps --------------------------------------------------------------------------------
    def dump(self, path, **options) -> Path:
        """Write the last run to ``path`` in the legacy TVM debug-executor layout.

        The folder is written under a temporary name and renamed when complete.  Read it back
        with :func:`tvm_probe.load_dump` (no TVM needed).  To write a dump while the model runs,
        without holding its tensors in memory, use ``run(..., stream_to=path)`` instead.

        After :meth:`call`, every call is written: ``calls.json`` and ``calls/<call>_<function>/``,
        each folder in the layout of one run (see :func:`tvm_probe.store.assemble.dump_calls`).

        Args:
            overwrite: replace an existing folder (refused by default).
            include_weights: store the weights too (left out by default: they are the model's).
            recomputed: store the values kept inside fused kernels (default True), recomputing
                them now; without them a dump holds what the run itself produced.
            timings: store per-kernel times (default True); they are the one part of a dump
                that differs between runs of the same model, inputs and pipeline.
            metadata: JSON-friendly data to keep with the dump (e.g. where the model came from).
        """
        if self._calls and not self._serve_run:  # calls of a multi-function executable
            return dump_calls(self, path, DumpOptions(**options))
        return dump_probe(self, path, DumpOptions(**options))

    @property
    def device_label(self) -> str:
        """How dumps name the device: ``CPU_0``, ``CUDA_0``..."""
        return device_label(self.built.target) + "_0"

    def __repr__(self) -> str:
        ran = "ran" if self._capture is not None else "not run"
        where = f", remote={self.remote}" if self.remote is not None else ""
        if len(self._functions) > 1:
            where += f", functions={list(self._functions)}, {len(self._calls)} calls"
        return (f"<Probe {len(self.imported.sources)} source values, {len(self.kernel_map.sites)} kernel "
                f"calls, pipeline={self.built.pipeline!r}, target={self.built.target.kind.name}{where}, {ran}>")


#: What a run leaves on a probe (restored by :meth:`Probe.verify`, which runs it once more).
_RUN_STATE = ("_capture", "_wanted", "_values", "_folded", "_calls", "_serve_run")



class _Functions(dict):
    """``{function: probe}`` of one executable; a name it lacks raises :class:`UnknownNameError`
    (a ``KeyError``) that says what the pipeline did to it, if it was imported."""

    executable: BuiltFunctions | None = None

    def __missing__(self, function):
        became = self.executable.became(function) if self.executable is not None else None
        raise UnknownNameError(f"the executable has no function {function!r}: "
                               + (became or f"it has {', '.join(self)}"), hint=None)


def _hand_over(capture: Capture):
    """What the VM function of a call returned, for its caller; the call's record keeps none of
    it: nothing is served from it, and holding a decode step's logits and KV tensors until
    ``forget_calls`` keeps the VM from reusing their memory (15-27 us a step, measured twice)."""
    returned, capture.returned = capture.returned, None
    return returned
