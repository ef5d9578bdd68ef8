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

from ..build.compile import BuiltModel, PipelineLike
from ..diagnose import compile_with_snapshots
from ..capture.executor import Capture, CapturePlanner, DebugExecutor
from ..core.errors import NotCapturedError, NotRunError, ProbeError
from ..core.inputs import InputChecker
from ..importer import ImportedModel, InputSpec
from ..kernel_map import ArgKind, KernelMap, PlaceKind, build_kernel_map, classify
from ..capture.recompute import evaluate_folded
from .calls import CallArguments, CallRecord, as_numpy, captured_bytes
from ..core.results import NodeInfo, Results, not_computed
from ..core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET
from ..core.sources import Served
from ..core.viewable import Viewable

log = logging.getLogger(__name__)

CaptureSpec = Union[str, Sequence[str], None]


class Probe(Results, Viewable):
    """A compiled model whose every intermediate value can be read by its source name.

    Build one with :meth:`from_onnx`; call :meth:`run` once per input; then :meth:`get`,
    :meth:`get_all`, :meth:`get_node_output`, :attr:`sources`, :attr:`nodes`, :meth:`dump`.
    The executable that runs is exactly what ``tvm.compile(mod, target, pipeline)`` builds.

    ``remote=`` runs it on a remote device over TVM RPC (see :mod:`tvm_probe.remote`): the
    executable is uploaded once, every run brings its captures back, and everything else
    (``get``, dumps, reports) is the same.
    """

    #: How the module was converted to reduced precision (a :class:`tvm_probe.precision.Lowered`), or None.
    precision = None

    def __init__(self, imported: ImportedModel, built: BuiltModel, kernel_map: KernelMap, remote=None):
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
        if hasattr(imported, "param_items"):  # a function of a Relax module: arguments by position
            from ..importer.relax import place_arguments

            place_arguments(imported, kernel_map, servings)
        self._functions: dict[str, "Probe"] = {self.function: self}
        self._calls: list[CallRecord] = []
        self._serve_run = True  # get() without call=: the last run() (else the last call())
        self._init_results(imported.sources, servings, self._static_nodes())
        self._planner = CapturePlanner(kernel_map, self._names)
        self._check_inputs = InputChecker(imported.inputs)
        self._arguments: CallArguments | None = None  # call(): made at the first call
        self._fast_calls: dict[tuple, tuple] = {}  # call(function, capture, kernel_times) → (probe, plan, wanted)
        self._call_plans: dict = {}  # call(): capture selection → _call_plan()
        self._timed_by: Capture | None = None  # the capture whose times (and sizes) the nodes show
        self._symbolic = any(isinstance(d, str) for n in self.node_infos for shape in n.out_shapes for d in shape)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_onnx(cls, model, target=DEFAULT_TARGET, pipeline: PipelineLike = DEFAULT_PIPELINE,
                  shapes: Mapping[str, Sequence[int]] | None = None, import_fixes: bool = True,
                  remote=None, precision=None) -> "Probe":
        """Import an ONNX model (path or ``onnx.ModelProto``) and compile it for ``target``.

        Args:
            model: a ``.onnx`` path or an ``onnx.ModelProto``.
            target: a TVM target: a kind (``"llvm"``, ``"cuda"``), a dict or JSON string with
                options (``{"kind": "cuda", "arch": "sm_90"}``), or a ``tvm.target.Target``.
            pipeline: ``"default"`` (what ``tvm.compile`` uses; unfused on CPU), ``"fused"``
                (``relax.get_default_pipeline(target)``) or any ``tvm.transform.Pass``.
            shapes: static shapes for inputs declared with symbolic dimensions (the shape
                arithmetic they fix is folded before TVM sees the model; see importer/static.py).
            import_fixes: rewrite the constructs TVM 0.27 cannot build (importer/fixes.py);
                :attr:`import_fixes` lists those used.  Defaults to True.
            remote: run on a remote device over TVM RPC: ``{"host": H, "port": P}`` or
                ``{"tracker": "H:P", "key": K}`` of a ``tvm-probe serve`` (see
                :mod:`tvm_probe.remote`).  Defaults to None (this machine).
            precision: build in reduced precision: ``"fp16"``, ``{"dtype": "fp16", "keep_fp32":
                [source names]}`` or a ``tvm.transform.Pass`` (see :mod:`tvm_probe.precision`);
                the same source names are served from that build.  Defaults to None (as imported).
        """
        from ..importer.onnx import import_onnx

        shapes = {k: tuple(v) for k, v in (shapes or {}).items()}
        return cls.from_imported(import_onnx(model, shapes, import_fixes=import_fixes), target, pipeline, remote,
                                 precision)

    @classmethod
    def from_torch(cls, module, example_inputs, target=DEFAULT_TARGET, pipeline: PipelineLike = DEFAULT_PIPELINE,
                   import_fixes: bool = True, remote=None, precision=None) -> "Probe":
        """Export a ``torch.nn.Module`` with ``torch.export`` and compile it for ``target``.

        Values answer to their fx node names (``bmm_3``) and module paths
        (``bert.encoder.layer.0.attention``: the module's output).  Needs ``tvm_probe[torch]``.

        Args:
            module: the model (put it in ``eval()`` mode first for inference behaviour).
            example_inputs: a tuple of tensors (the shapes are compiled statically).
            target, pipeline, import_fixes, remote, precision: as for :meth:`from_onnx`.
        """
        from ..importer.torch import import_torch

        return cls.from_imported(import_torch(module, example_inputs, import_fixes=import_fixes), target, pipeline,
                                 remote, precision)

    @classmethod
    def from_tflite(cls, model, target=DEFAULT_TARGET, pipeline: PipelineLike = DEFAULT_PIPELINE,
                    shapes: Mapping[str, Sequence[int]] | None = None, remote=None, precision=None) -> "Probe":
        """Import a TFLite model (path or bytes) and compile it for ``target``.

        Values answer to their TFLite tensor names, which are TensorFlow's op names
        (``layer_._0/attention/self/MatMul``); a name the converter merged (``a;b``) answers to
        each part too.  Needs ``tvm_probe[tflite]``.

        Args:
            model: a ``.tflite`` path or the file's bytes.
            target, pipeline, remote, precision: as for :meth:`from_onnx`.
            shapes: static shapes for inputs, overriding those the model declares.
        """
        from ..importer.tflite import import_tflite

        shapes = {k: tuple(v) for k, v in (shapes or {}).items()}
        return cls.from_imported(import_tflite(model, shapes), target, pipeline, remote, precision)

    @classmethod
    def from_relax(cls, mod, params: Mapping[str, object] | None = None, target=DEFAULT_TARGET,
                   pipeline: PipelineLike = DEFAULT_PIPELINE) -> "Probe":
        """Compile a Relax IRModule (one function or several) for ``target``.

        Every tensor binding of every function answers to its binding name (``matmul3``),
        parameters to theirs.  Run a function with :meth:`call` (``run`` for a module whose only
        function is ``main``).

        Args:
            mod: a ``tvm.IRModule`` with Relax functions (as built or imported: the pipeline
                has not run on it).
            params: ``{parameter name: array}``: weights the probe passes at every call, so
                callers pass only the other arguments.  The module is compiled as it is (the
                weights are not bound into it), so what runs is what you deploy.
            target, pipeline: as for :meth:`from_onnx`.
        """
        from ..importer.relax import check_params, import_relax, public_functions

        names = public_functions(mod)
        check_params(mod, names, params)
        models = {f: import_relax(mod, params, f) for f in names}
        return cls._from_functions(mod, models, target, pipeline)

    @classmethod
    def from_nn(cls, module, spec, params: Mapping[str, object] | None = None, target=DEFAULT_TARGET,
                pipeline: PipelineLike = DEFAULT_PIPELINE) -> "Probe":
        """Export a ``tvm.relax.frontend.nn.Module`` with ``export_tvm`` and compile it.

        Values answer to module paths (``model.layers.0.self_attn``: the module's output, as
        ``export_tvm`` traced it), parameters to their dotted names
        (``model.layers.0.mlp.down_proj.weight``), and every binding to its name.

        Args:
            module: the nn.Module.
            spec: what ``export_tvm`` takes (a ``ModuleSpec`` or its dict form), with
                ``param_mode`` ``"plain"`` or ``"packed"``.
            params: ``{dotted name: array}``: the weights, passed by the probe at every call (then
                callers pass only the inputs).  Without them, pass the weights as the compiled
                function takes them (plain: one argument each; packed: one list of tensors).
            target, pipeline: as for :meth:`from_onnx`.
        """
        from ..importer.nn import import_nn

        mod, models = import_nn(module, spec, params)
        return cls._from_functions(mod, models, target, pipeline)

    @classmethod
    def from_hf(cls, model, pipeline: PipelineLike = DEFAULT_PIPELINE, target=DEFAULT_TARGET, max_len: int = 64,
                import_fixes: bool = True) -> "Probe":
        """A transformers ``*ForCausalLM`` with an explicit KV cache: functions ``prefill`` and
        ``decode`` of one executable (symbolic prompt and past lengths); :meth:`generate` drives
        them.  Values answer to the wrapper's module paths (``model.model.layers.0.self_attn``,
        ``model.lm_head``), fx node names and parameter names.  See :mod:`tvm_probe.hf`.

        Args:
            model: the causal LM (its weights as they are; put in eval mode).
            pipeline, target, import_fixes: as for :meth:`from_torch`.
            max_len: the longest prompt + generated length :meth:`generate` accepts.
        """
        from ..llm.hf import from_hf

        return from_hf(cls, model, pipeline, target, max_len, import_fixes)

    def generate(self, input_ids, steps: int, capture: CaptureSpec = "all") -> list[int]:
        """``steps`` new token ids, greedy, from the compiled executable (call 0: the prefill,
        calls 1..steps-1: decode steps; read values with ``get(name, call=k)``).  Only for a
        probe made by :meth:`from_hf`; :func:`tvm_probe.hf.compare_generation` checks it."""
        from ..llm.hf import generate

        return generate(self, input_ids, steps, capture)

    @classmethod
    def _from_functions(cls, mod, models: dict, target, pipeline) -> "Probe":
        """One compile of ``mod``; a function probe per model; the first is the one returned."""
        from ..core.errors import ModelError
        from ..importer.relax import function_built, hold_on_device

        if not models:
            raise ModelError("the module has no public Relax function (one with a global_symbol) to run: "
                             "build it with relax.BlockBuilder.function or give its functions a global_symbol")
        built = compile_with_snapshots(mod, target, pipeline)
        hold_on_device(models, built.device)
        probes: dict[str, Probe] = {}
        for name, model in models.items():
            fbuilt = function_built(built, name)
            probe = cls(model, fbuilt, build_kernel_map(model, fbuilt.snapshots))
            if probes:
                probe._executor.share_vm(next(iter(probes.values()))._executor)
            probes[name] = probe
        first = next(iter(probes.values()))
        first._functions = probes
        return first

    @classmethod
    def from_imported(cls, imported: ImportedModel, target=DEFAULT_TARGET, pipeline: PipelineLike = DEFAULT_PIPELINE,
                      remote=None, precision=None) -> "Probe":
        """Compile a model an importer produced (what the ``from_*`` constructors do after importing).

        A ``remote`` device is connected to first, so that a wrong address fails before the compile.
        ``precision`` (see :meth:`from_onnx`) converts the module before the pipeline compiles it.
        """
        if remote is not None:
            from ..capture.remote import connect

            remote = connect(remote)
        lowered = None
        if precision is not None:
            from ..build.precision import lower_precision

            imported, lowered = lower_precision(imported, precision)
        built = compile_with_snapshots(imported.mod, target, pipeline, imported=imported)
        probe = cls(imported, built, build_kernel_map(imported, built.snapshots), remote=remote)
        if lowered is not None:
            lowered.attach(probe)
        return probe

    # -- multi-function executables ------------------------------------------------------------
    @property
    def function(self) -> str:
        """The VM function this probe's :meth:`run` calls (``"main"`` for imported models)."""
        return getattr(self.imported, "function", "main")

    @property
    def functions(self) -> dict[str, "Probe"]:
        """Function name → the probe of that function (this one among them)."""
        return dict(self._functions)

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
            probe, plan, wanted = fast
            run, arguments = probe._executor.fast_calls.get(plan), probe._arguments.as_passed(args)
            if run is not None and arguments is not None:
                result = run(arguments, probe._arguments.arrays_at)
                self._record_call(function, result, wanted)
                return result.returned
        probe = self._functions.get(function) or self._function_probe(function)
        if probe._arguments is None:
            probe._arguments = CallArguments(probe.imported, function)
        arrays = probe._arguments(args)
        layouts, plan, wanted = probe._call_plan(capture)
        if self._calls and self._calls[-1].function != function:
            probe._executor.forget_instrument()  # the VM holds the other function's instrument
        result = probe._executor.run(arrays, plan, raw=True, kernel_times=kernel_times,
                                     arrays_at=probe._arguments.arrays_at)
        if not layouts and not kernel_times and plan.outputs is not None and probe._executor.fast_call(plan):
            self._fast_calls[key] = probe, plan, wanted
        record = self._record_call(function, result, wanted)
        if layouts:  # what the KV caches hold after this call (it changes with the next)
            from ..importer.kv_cache import read_kv

            for layout in layouts:
                record.kv.update(read_kv(arrays[layout.param], layout))
        return result.returned

    def _record_call(self, function: str, result: Capture, wanted) -> CallRecord:
        """The next call's record, kept; ``get`` without ``call=`` serves it from now on."""
        record = CallRecord(index=len(self._calls), function=function, capture=result, wanted=wanted,
                            time_us=result.total_us, captured_bytes=captured_bytes(result))
        self._calls.append(record)
        self._serve_run = False
        return record

    @property
    def kv_layouts(self) -> list:
        """The paged KV caches this function attends with (:class:`tvm_probe.kv_cache.CacheLayout`)."""
        if not hasattr(self, "_kv_layouts"):
            from ..importer.kv_cache import cache_layouts

            self._kv_layouts = cache_layouts(self.imported.mod["main"])
        return self._kv_layouts

    def _call_plan(self, capture: CaptureSpec) -> tuple:
        """``(KV caches to read after the call, CapturePlan, wanted keys)`` for ``capture``, made
        once per selection (a decode loop asks for the same one at every step)."""
        key = capture if capture is None or isinstance(capture, str) else tuple(capture)
        planned = self._call_plans.get(key)
        if planned is None:
            layouts, rest = self._kv_wanted(capture)
            if len(self._call_plans) >= 64:
                self._call_plans.clear()
            planned = self._call_plans[key] = (layouts, *self._planner.plan(rest))
        return planned

    def _kv_wanted(self, capture: CaptureSpec) -> tuple[list, CaptureSpec]:
        """The caches whose K/V a call with ``capture`` reads afterwards, and ``capture`` less
        the K/V names (which are no kernel outputs)."""
        layouts = self.kv_layouts
        if not layouts or capture is None:
            return [], capture
        if capture == "all":
            return layouts, capture
        names = [capture] if isinstance(capture, str) else list(capture)
        if not hasattr(self, "_kv_names"):
            self._kv_names = frozenset(n for layout in layouts for n in layout.names())
        kv_names = self._kv_names
        if not kv_names.intersection(names):
            return [], capture
        chosen = [l for l in layouts if any(n in kv_names and n.startswith(l.name + ".") for n in names)]
        rest = [n for n in names if n not in kv_names]
        return chosen, rest

    @property
    def calls(self):
        """DataFrame: one row per :meth:`call` — call, function, time_us, captured_bytes."""
        import pandas as pd

        return pd.DataFrame([{"call": r.index, "function": r.function, "time_us": r.time_us,
                              "captured_bytes": r.captured_bytes} for r in self._calls],
                            columns=["call", "function", "time_us", "captured_bytes"])

    @property
    def num_calls(self) -> int:
        """How many :meth:`call` s were made (forgotten ones included): the last call is number
        ``num_calls - 1``."""
        return len(self._calls)

    @property
    def call_records(self) -> tuple[CallRecord, ...]:
        """Every :meth:`call`'s :class:`~tvm_probe.calls.CallRecord`, in call order; those
        dropped by :meth:`forget_calls` have ``capture=None`` (:meth:`call_record` refuses them)."""
        return tuple(self._calls)

    def forget_calls(self, keep_last: int = 0) -> None:
        """Drop the captures of all calls but the last ``keep_last`` (every call keeps what it
        captured until then: a long generation grows by one capture per step).  Calls keep
        their numbers."""
        if keep_last < 0:
            raise ProbeError(f"keep_last must be >= 0, got {keep_last}")
        for record in self._calls[:len(self._calls) - keep_last]:
            record.capture, record.values, record.kv, record.wanted = None, {}, {}, set()

    def call_record(self, call: int | None = None) -> CallRecord:
        """Call ``call`` (default: the last one), or a one-line error."""
        if not self._calls:
            raise NotRunError("no function has been called yet: use probe.call(function, *args)")
        if call is None:
            return self._calls[-1]
        if not isinstance(call, (int, np.integer)) or not -len(self._calls) <= call < len(self._calls):
            raise ProbeError(f"there is no call {call!r}: calls are numbered 0..{len(self._calls) - 1}")
        record = self._calls[call]
        if record.capture is None:
            raise NotRunError(f"call {record.index} ({record.function}) was forgotten (forget_calls): "
                              "only later calls can be read")
        return record

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
        self._values = record.values
        try:
            yield self
        finally:
            record.values = self._values
            if saved[0] is not record.capture:
                if saved[0] is not None:
                    self._accept(saved[0], saved[1])
                self._capture, self._wanted, self._values = saved

    def get(self, name: str, call: int | None = None) -> np.ndarray:
        """The value of ``name``: in the last :meth:`run`, or in call ``call`` of :meth:`call`
        (default: the last call, when a call came after the last run).  Names resolve within
        the function that call ran."""
        if call is None and self._serve_run:
            return super().get(name)
        record = self.call_record(call)
        if name in record.kv:
            return record.kv[name]
        with self.in_call(call) as probe:
            return Results.get(probe, name)

    def get_all(self, pattern: str, call: int | None = None) -> dict[str, np.ndarray]:
        """Every value matching ``pattern`` (see :meth:`get` for ``call``)."""
        if call is None and self._serve_run:
            return super().get_all(pattern)
        with self.in_call(call) as probe:
            return Results.get_all(probe, pattern)

    def compare(self, reference, call: int | None = None, name_map: Mapping[str, str] | None = None,
                atol: float | None = None, rtol: float | None = None):
        """Compare one call (default: the last) with ``reference`` (``{name: array}``, e.g. from
        PyTorch forward hooks, by module path); ``name_map`` maps reference names to this
        model's where the two models' paths differ.  Returns a
        :class:`~tvm_probe.compare.Comparison`.  :func:`tvm_probe.calls.compare_calls` does
        several calls at once (a report per call)."""
        from .calls import compare_call

        return compare_call(self, reference, call, name_map, atol, rtol)

    def _function_probe(self, function: str) -> "Probe":
        if function not in self._functions:
            raise ProbeError(f"the executable has no function {function!r}: it has "
                             f"{', '.join(self._functions)}")
        return self._functions[function]

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
        (``"inputs"``) and each model output back (``"outputs"``), by name; None before a run."""
        if self._capture is None:
            return None
        return {"inputs": dict(zip((s.name for s in self.imported.inputs), self._capture.input_us)),
                "outputs": dict(zip(self.imported.sources.model_outputs, self._capture.output_us))}

    @property
    def remote(self) -> str | None:
        """Where the model runs when it runs remotely (``host:port``, or the tracker and key)."""
        return self._executor.remote.where if self._executor.remote is not None else None

    @property
    def instrument(self) -> str | None:
        """Which capture instrument ran the last :meth:`run`: ``"native"`` (C++, see
        :mod:`tvm_probe.native`) or ``"python"``; None before the first run.  Also in
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
            A :class:`~tvm_probe.verify.Verification`, truthy when nothing disagreed;
            ``.summary()`` is one line.
        """
        from .verify import verify

        saved = {name: getattr(self, name) for name in _RUN_STATE if hasattr(self, name)}
        saved = {name: (value.copy() if isinstance(value, (dict, list, set)) else value) for name, value in saved.items()}
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

    def _static_nodes(self) -> list[NodeInfo]:
        n_in = self.num_input_nodes
        sources = self.imported.sources
        # (a function's arguments may be objects — a KV cache, a shape — that are no source values)
        nodes = [NodeInfo(index=i, name=s.name, op="null", out_shapes=[s.shape], out_dtypes=[s.dtype],
                          output_keys=[[s.name] if s.name in sources else []])
                 for i, s in enumerate(self.imported.inputs)]
        for site in self.kernel_map.sites:
            inputs = [(n_in + a.node, a.output) if a.kind is ArgKind.NODE else (a.input_index, 0)
                      for a in site.args if a.kind in (ArgKind.NODE, ArgKind.INPUT)]
            name = site.symbol if site.occurrence == 0 else f"{site.symbol}_{site.occurrence}"
            nodes.append(NodeInfo(
                index=n_in + site.index, name=name, op="tvm_op", symbol=site.symbol,
                occurrence=site.occurrence, is_view=site.is_view, inputs=inputs,
                const_inputs=sum(a.kind is ArgKind.CONST for a in site.args),
                out_shapes=list(site.out_shapes), out_dtypes=list(site.out_dtypes),
                output_keys=[list(k) for k in site.output_keys], interior_keys=list(site.interior_keys)))
        return nodes

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
                plain run almost nothing (see :mod:`tvm_probe.kernel_hook`).  True times every
                call; False never asks for it.
            instrument: your own :class:`~tvm_probe.instrument.Instrument`, called around
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
            The model outputs, by output tensor name.
        """
        if len(self._functions) > 1 or hasattr(self.imported, "param_items"):
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
                from ..store.assemble import DumpOptions, run_streaming

                run_streaming(self, arrays, plan, Path(stream_to), DumpOptions(**dump_options),
                              execute=lambda sink: self._executor.run(arrays, plan, sink=sink),
                              serve=lambda capture: self._accept(capture, wanted))
            else:
                self._accept(self._executor.run(arrays, plan, kernel_times=kernel_times, observer=instrument), wanted)
            self._serve_run = True
        finally:
            if build is not None:
                _join_build(build)
        return dict(zip(self.imported.sources.model_outputs, self._capture.result))

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
        n_in, (start_us, time_us) = self.num_input_nodes, capture.kernel_times()
        if time_us or (previous is not None and previous.kernel_times()[1]):  # (untimed after untimed: nothing to do)
            for node in self._nodes[n_in:]:
                node.time_us = time_us.get(node.index - n_in)
                node.start_us = start_us.get(node.index - n_in)
        if self._symbolic:
            self._record_sizes(capture)

    def _record_sizes(self, capture: Capture) -> None:
        """Symbolic dimensions: the nodes take this run's sizes where the run shows them."""
        n_in = self.num_input_nodes
        for node, array in zip(self._nodes[:n_in], capture.inputs):
            if hasattr(array, "shape"):  # (a call's arguments may be objects: a KV cache, a shape)
                node.out_shapes = [tuple(int(d) for d in array.shape)]
        for node in self._nodes[n_in:]:
            site = node.index - n_in
            outs = capture.outputs[site] if site in capture.outputs else None
            node.out_shapes = ([tuple(a.shape) for a in outs] if outs is not None
                               else list(self.kernel_map.sites[site].out_shapes))

    # -- serving values -----------------------------------------------------------------------
    def _require_run(self) -> Capture:
        if self._capture is None:
            raise NotRunError("the model has not run yet: call probe.run(inputs) before reading values")
        return self._capture

    def _value(self, key: str) -> np.ndarray:
        capture = self._require_run()
        value, serving = self.imported.sources[key], self.servings[key]
        served, place = serving.served, self.kernel_map.places.get(key)
        if served is Served.INPUT:
            item = getattr(self.imported, "param_items", {}).get(key)
            if item is not None:  # an element of a tuple argument (packed weights)
                return as_numpy(capture.inputs[item.param][item.element])
            return as_numpy(capture.inputs[serving.node_index])
        if served is Served.SHAPE:  # the ONNX value is an int64 scalar or [1] tensor of that size
            size = capture.inputs[place.input_index].shape[place.output]
            return np.asarray(size, dtype=value.dtype or "int64").reshape(value.shape or ())
        if served is Served.CONSTANT:
            return self.imported.constants[key]
        if served is Served.FOLDED:
            if key not in self._folded:
                self._folded.update(self._evaluate_folded())
            return self._folded[key]
        if served in (Served.CAPTURED, Served.VIEW):
            return self._site_output(place.site, place.output, value.display_name)
        if served is Served.RECOMPUTED:
            if key not in self._values:
                self._values.update(self.values_kept_inside(self.kernel_map.sites[place.site], key))
            return self._values[key]
        raise not_computed(value, served, self.kernel_map.lost.get(key, ""), key in self.kernel_map.known_limits)

    def _evaluate_folded(self) -> dict[str, np.ndarray]:
        """Every value the pipeline folded: constants as they are, the rest in one build."""
        places = {k: p for k, p in self.kernel_map.places.items() if self.servings[k].served is Served.FOLDED}
        values = {k: p.const.value.numpy() for k, p in places.items() if p.kind is PlaceKind.CONSTANT}
        folded = {k: p.var for k, p in places.items() if p.kind is PlaceKind.FOLDED}
        unique = list(dict.fromkeys(folded.values()))
        if unique:
            # on this machine's CPU, as FoldConstant itself evaluates them (TVM builds them for "llvm")
            from ..build.compile import parse_target

            arrays = dict(zip(unique, evaluate_folded(self.built.snapshots.pre_fold, unique, parse_target(DEFAULT_TARGET))))
            values.update({k: arrays[v] for k, v in folded.items()})
        return values

    def values_kept_inside(self, site, key: str) -> dict[str, np.ndarray]:
        """Every source value the fused call site ``site`` keeps inside, by key, recomputed at
        once from the inputs it received in the last run (``key``, the value asked for, names
        it in errors).  Not cached: :meth:`get` caches; a streamed dump holds one site at a time."""
        inputs = self._site_inputs(site, self.imported.sources[key].display_name)
        places = self.kernel_map.places
        keys = [k for k in site.interior_keys if places[k].kind is PlaceKind.INTERIOR]
        shapes = [getattr(a, "shape", None) for a in self._require_run().inputs]
        tensors = self._recomputer.interior_values(site, inputs, {places[k].inner for k in keys}, shapes)
        return {k: tensors[places[k].inner] for k in keys}

    def _site_output(self, site: int, k: int, why: str) -> np.ndarray:
        outs = self._require_run().outputs.get(site)
        if outs is None:
            raise NotCapturedError(
                f"{why!r} was not captured by the last run: add it to run(..., capture=[...]) "
                "or use capture='all'")
        return outs[k]

    def _site_inputs(self, site, why: str) -> list[np.ndarray]:
        capture = self._require_run()
        values = []
        for j, arg in enumerate(site.args):
            if arg.kind is ArgKind.NODE:
                values.append(self._site_output(arg.node, arg.output, why))
            elif arg.kind is ArgKind.INPUT:
                values.append(capture.inputs[arg.input_index])
            elif arg.kind is ArgKind.CONST:
                values.append(arg.const.value.numpy())
            else:
                held = capture.untracked_inputs.get(site.index, {})
                if j not in held:
                    raise NotCapturedError(f"the inputs of the kernel computing {why!r} were not captured: "
                                           "add it to run(..., capture=[...]) or use capture='all'")
                values.append(held[j])
        return values

    def can_recompute(self, site) -> bool:
        """Whether the last run kept every input of the call site ``site``, so that what it
        keeps inside can be recomputed (:meth:`values_kept_inside`) without an error."""
        capture = self._require_run()
        held = capture.untracked_inputs.get(site.index, {})
        return all(a.node in capture.outputs if a.kind is ArgKind.NODE else (a.kind is not ArgKind.UNTRACKED or j in held)
                   for j, a in enumerate(site.args))

    def _node_output(self, index: int, output: int) -> np.ndarray:
        capture = self._require_run()
        if index < self.num_input_nodes:
            return capture.inputs[index]
        node = self.node_infos[index]
        return self._site_output(index - self.num_input_nodes, output, node.name)

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
        from ..store.assemble import DumpOptions, dump_calls, dump_probe

        if self._calls and not self._serve_run:  # calls of a multi-function executable
            return dump_calls(self, path, DumpOptions(**options))
        return dump_probe(self, path, DumpOptions(**options))

    @property
    def device_label(self) -> str:
        """How dumps name the device: ``CPU_0``, ``CUDA_0``..."""
        from ..core.device import device_label

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


def _join_build(thread) -> None:
    """Wait for a build started alongside a run.  A Ctrl-C meanwhile is raised once it is over:
    while it lasts, file descriptor 2 goes to the log, and so would the interruption's message."""
    interrupted = False
    while thread.is_alive():
        try:
            thread.join()
        except KeyboardInterrupt:
            interrupted = True
    if interrupted:
        raise KeyboardInterrupt
