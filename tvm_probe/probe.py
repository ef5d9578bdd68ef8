"""The Probe: import → compile → map → run → serve values by source name.

    probe = Probe.from_onnx("bert.onnx", target="llvm", pipeline="fused")
    probe.run({"input_ids": ids, "attention_mask": mask})
    probe.get("layer_._0/attention/self/MatMul")
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable, Mapping, Sequence, Union

import numpy as np

from .build import BuiltModel, PipelineLike, compile_with_snapshots
from .capture import Capture, CapturePlan, DebugExecutor
from .errors import InputError, NotCapturedError, NotRunError, ProbeError, ValueUnavailableError
from .importer import ImportedModel, InputSpec
from .kernel_map import KernelMap, build_kernel_map
from .recompute import Recomputer, depends_on_params, evaluate_folded
from .results import NodeInfo, Results
from .sources import Kind, Served

log = logging.getLogger(__name__)

CaptureSpec = Union[str, Sequence[str], None]


class Probe(Results):
    """A compiled model whose every intermediate value can be read by its source name.

    Build one with :meth:`from_onnx`; call :meth:`run` once per input; then :meth:`get`,
    :meth:`get_all`, :meth:`get_node_output`, :attr:`sources`, :attr:`nodes`, :meth:`dump`.
    The executable that runs is exactly what ``tvm.compile(mod, target, pipeline)`` builds.
    """

    def __init__(self, imported: ImportedModel, built: BuiltModel, kernel_map: KernelMap):
        self.imported, self.built, self.kernel_map = imported, built, kernel_map
        self._executor = DebugExecutor(built, kernel_map)
        self._recomputer = Recomputer(built.target)
        self._capture: Capture | None = None
        self._wanted: set[str] | None = None
        self._values: dict[str, np.ndarray] = {}
        self._folded: dict[str, np.ndarray] = {}
        self._var_of = {}
        for var, keys in imported.var_keys.items():
            for key in keys:
                self._var_of.setdefault(key, var)
        self._input_alias: dict[str, int] = {}
        self._classify()
        self._init_results(imported.sources, self._static_nodes())

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_onnx(cls, model, target="llvm", pipeline: PipelineLike = "default",
                  shapes: Mapping[str, Sequence[int]] | None = None) -> "Probe":
        """Import an ONNX model (path or ``onnx.ModelProto``) and compile it for ``target``.

        Args:
            model: a ``.onnx`` path or an ``onnx.ModelProto``.
            target: a TVM target (``"llvm"``, ``"cuda"``, a ``tvm.target.Target``).
            pipeline: ``"default"`` (what ``tvm.compile`` uses; unfused on CPU), ``"fused"``
                (``relax.get_default_pipeline(target)``) or any ``tvm.transform.Pass``.
            shapes: static shapes for inputs declared with symbolic dimensions.
        """
        from .importer.onnx import import_onnx

        imported = import_onnx(model, {k: tuple(v) for k, v in (shapes or {}).items()})
        built = compile_with_snapshots(imported.mod, target, pipeline)
        return cls(imported, built, build_kernel_map(imported, built.snapshots))

    @classmethod
    def from_torch(cls, module, example_inputs, target="llvm", pipeline: PipelineLike = "default") -> "Probe":
        """Export a ``torch.nn.Module`` with ``torch.export`` and compile it for ``target``.

        Values answer to their fx node names (``bmm_3``) and module paths
        (``bert.encoder.layer.0.attention``: the module's output).  Needs ``tvm_probe[torch]``.

        Args:
            module: the model (put it in ``eval()`` mode first for inference behaviour).
            example_inputs: a tuple of tensors (the shapes are compiled statically).
            target, pipeline: as for :meth:`from_onnx`.
        """
        from .importer.torch import import_torch

        imported = import_torch(module, example_inputs)
        built = compile_with_snapshots(imported.mod, target, pipeline)
        return cls(imported, built, build_kernel_map(imported, built.snapshots))

    @property
    def inputs(self) -> list[InputSpec]:
        """The inputs :meth:`run` takes: name, shape, dtype."""
        return list(self.imported.inputs)

    @property
    def last_run_us(self) -> float | None:
        """Wall time of the last :meth:`run` of the executable, in microseconds."""
        return self._capture.total_us if self._capture is not None else None

    @property
    def pipeline(self) -> str:
        return self.built.pipeline

    @property
    def num_input_nodes(self) -> int:
        return len(self.imported.inputs)

    def _classify(self) -> None:
        """Decide how each source value is served (see :class:`~tvm_probe.sources.Served`)."""
        km, main = self.kernel_map, self.imported.mod["main"]
        params = list(main.params)
        n_in = self.num_input_nodes
        for value in self.imported.sources:
            key = value.key
            if value.kind is Kind.INPUT:
                value.served, value.node_index = Served.INPUT, self._input_index(key)
            elif value.kind in (Kind.PARAM, Kind.CONSTANT):
                value.served = Served.CONSTANT
            elif key in km.output_of:
                site, _ = km.output_of[key]
                value.served = Served.VIEW if km.sites[site].is_view else Served.CAPTURED
                value.node_index = n_in + site
            elif key in km.interior_of:
                value.served, value.node_index = Served.RECOMPUTED, n_in + km.interior_of[key]
            elif self._var_of.get(key) in params:
                self._input_alias[key] = params.index(self._var_of[key])
                value.served, value.node_index = Served.INPUT, self._input_alias[key]
            elif key in self._var_of and not depends_on_params(main, self._var_of[key]):
                value.served = Served.FOLDED
            else:
                value.served = Served.UNAVAILABLE

    def _input_index(self, key: str) -> int:
        return [s.name for s in self.imported.inputs].index(key)

    def _static_nodes(self) -> list[NodeInfo]:
        n_in = self.num_input_nodes
        nodes = [NodeInfo(index=i, name=s.name, op="null", out_shapes=[s.shape], out_dtypes=[s.dtype],
                          output_keys=[[s.name]]) for i, s in enumerate(self.imported.inputs)]
        for site in self.kernel_map.sites:
            inputs = [(n_in + a.node, a.output) if a.kind == "node" else (a.input_index, 0)
                      for a in site.args if a.kind in ("node", "input")]
            name = site.symbol if site.occurrence == 0 else f"{site.symbol}_{site.occurrence}"
            nodes.append(NodeInfo(
                index=n_in + site.index, name=name, op="tvm_op", symbol=site.symbol,
                occurrence=site.occurrence, is_view=site.is_view, inputs=inputs,
                const_inputs=sum(a.kind == "const" for a in site.args),
                out_shapes=list(site.out_shapes), out_dtypes=list(site.out_dtypes),
                output_keys=[list(k) for k in site.output_keys], interior_keys=list(site.interior_keys)))
        return nodes

    # -- running ------------------------------------------------------------------------------
    def run(self, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray] | None = None,
            capture: CaptureSpec = "all") -> dict[str, np.ndarray]:
        """Run the deployed executable once and capture intermediate values.

        Args:
            inputs: ``{input name: array}`` or a list in :attr:`inputs` order.
            capture: ``"all"``; a name, pattern or list of them (then only what those values
                need is copied: their kernel outputs, or the inputs of the kernels that keep
                them inside); or ``None`` for no capture at all (per-kernel times only).

        Returns:
            The model outputs, by output tensor name.
        """
        arrays = self._check_inputs(inputs)
        plan, wanted = self._plan(capture)
        self._capture = self._executor.run(arrays, plan)
        self._wanted, self._values = wanted, {}
        for node in self.node_infos[self.num_input_nodes:]:
            site = node.index - self.num_input_nodes
            node.time_us = self._capture.time_us.get(site)
            node.start_us = self._capture.start_us.get(site)
        outs = self.imported.sources.model_outputs
        return dict(zip(outs, self._capture.result))

    def _check_inputs(self, inputs) -> list[np.ndarray]:
        specs = self.imported.inputs
        expected = ", ".join(f"{s.name} {s.dtype}{list(s.shape)}" for s in specs)
        if inputs is None:
            raise InputError(f"no inputs given: run() needs {expected}")
        if isinstance(inputs, Mapping):
            names = [s.name for s in specs]
            missing = [n for n in names if n not in inputs]
            extra = [n for n in inputs if n not in names]
            if missing:
                raise InputError(f"missing input(s) {', '.join(map(repr, missing))}: run() needs {expected}")
            if extra:
                raise InputError(f"unknown input(s) {', '.join(map(repr, extra))}: the model's inputs are {expected}")
            values = [inputs[n] for n in names]
        else:
            values = list(inputs)
            if len(values) != len(specs):
                raise InputError(f"got {len(values)} inputs, the model takes {len(specs)}: {expected}")
        return [self._check_one(spec, v) for spec, v in zip(specs, values)]

    @staticmethod
    def _check_one(spec: InputSpec, value) -> np.ndarray:
        array = np.asarray(value)
        if array.dtype == object:
            raise InputError(f"input {spec.name!r} is not a numeric array: give a numpy array of {spec.dtype}")
        if array.dtype != np.dtype(spec.dtype):
            raise InputError(f"input {spec.name!r} has dtype {array.dtype}, the model expects {spec.dtype}: "
                             f"convert it with .astype('{spec.dtype}')")
        if tuple(array.shape) != tuple(spec.shape):
            raise InputError(f"input {spec.name!r} has shape {list(array.shape)}, the model expects "
                             f"{list(spec.shape)}")
        return np.ascontiguousarray(array)

    def _plan(self, capture: CaptureSpec) -> tuple[CapturePlan, set[str] | None]:
        km = self.kernel_map
        untracked_all = frozenset(s.index for s in km.sites
                                  if s.group and any(a.kind == "untracked" for a in s.args))
        if capture == "all":
            return CapturePlan(outputs=None, untracked_inputs=untracked_all), None
        if capture is None:
            return CapturePlan(outputs=frozenset()), set()
        patterns = [capture] if isinstance(capture, str) else list(capture)
        wanted = {k for p in patterns for k in self._names.match(p)}
        outputs, untracked = set(), set()
        for key in wanted:
            if key in km.output_of:
                outputs.add(km.output_of[key][0])
            elif key in km.interior_of:
                site = km.sites[km.interior_of[key]]
                outputs |= {a.node for a in site.args if a.kind == "node"}
                if site.index in untracked_all:
                    untracked.add(site.index)
        return CapturePlan(outputs=frozenset(outputs), untracked_inputs=frozenset(untracked)), wanted

    # -- serving values -----------------------------------------------------------------------
    def _require_run(self) -> Capture:
        if self._capture is None:
            raise NotRunError("the model has not run yet: call probe.run(inputs) before reading values")
        return self._capture

    def _value(self, key: str) -> np.ndarray:
        capture = self._require_run()
        value = self.imported.sources[key]
        served = value.served
        if served is Served.INPUT:
            index = self._input_alias.get(key, value.node_index)
            return capture.inputs[index]
        if served is Served.CONSTANT:
            return self.imported.constants[key]
        if served is Served.FOLDED:
            if key not in self._folded:
                self._folded[key] = evaluate_folded(self.imported.mod["main"], self._var_of[key], self.built.target)
            return self._folded[key]
        if served in (Served.CAPTURED, Served.VIEW):
            site, k = self.kernel_map.output_of[key]
            return self._site_output(site, k, value.display_name)
        if served is Served.RECOMPUTED:
            if key not in self._values:
                site = self.kernel_map.sites[self.kernel_map.interior_of[key]]
                inputs = self._site_inputs(site, value.display_name)
                self._values.update(self._recomputer.interior_values(site, inputs))
            return self._values[key]
        raise ValueUnavailableError(
            f"{value.display_name!r} is never computed by the compiled module: no model output "
            "depends on it, so TVM dropped it as dead code")

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
            if arg.kind == "node":
                values.append(self._site_output(arg.node, arg.output, why))
            elif arg.kind == "input":
                values.append(capture.inputs[arg.input_index])
            elif arg.kind == "const":
                values.append(arg.const.value.numpy())
            else:
                held = capture.untracked_inputs.get(site.index, {})
                if j not in held:
                    raise NotCapturedError(f"the inputs of the kernel computing {why!r} were not captured: "
                                           "add it to run(..., capture=[...]) or use capture='all'")
                values.append(held[j])
        return values

    def _node_output(self, index: int, output: int) -> np.ndarray:
        capture = self._require_run()
        if index < self.num_input_nodes:
            return capture.inputs[index]
        node = self.node_infos[index]
        return self._site_output(index - self.num_input_nodes, output, node.name)

    # -- dumps --------------------------------------------------------------------------------
    def available_keys(self) -> Iterable[str]:
        """Keys whose value the last run can serve (what a dump of it stores)."""
        for value in self.imported.sources:
            if value.served is Served.UNAVAILABLE:
                continue
            if self._wanted is not None and value.key not in self._wanted and value.served in (
                    Served.RECOMPUTED, Served.FOLDED):
                continue
            yield value.key

    def dump(self, path, overwrite: bool = False, include_weights: bool = False,
             metadata: dict | None = None) -> Path:
        """Write the last run to ``path`` in the legacy TVM debug-executor layout.

        The folder is written under a temporary name and renamed when complete; an existing
        folder is replaced only with ``overwrite=True``.  Weights are left out unless
        ``include_weights``.  ``metadata`` (JSON-friendly) is stored with the dump, e.g. where
        the model came from.  Read it back with :func:`tvm_probe.load_dump` (no TVM needed).
        """
        from .store.dump import DumpContent, write_dump

        capture = self._require_run()
        values: dict[str, np.ndarray] = {}
        for key in self.available_keys():
            value = self.imported.sources[key]
            if value.served in (Served.CAPTURED, Served.VIEW, Served.INPUT):
                continue  # stored once, as a node's output
            if value.kind is Kind.PARAM and not include_weights:
                continue
            try:
                values[key] = self._value(key)
            except NotCapturedError:
                continue
        content = DumpContent(
            sources=self.imported.sources, nodes=self.node_infos,
            node_outputs={self.num_input_nodes + s: outs for s, outs in capture.outputs.items()},
            inputs=capture.inputs, values=values, device=self._device_label(),
            model_hash=self.imported.model_hash, target=str(self.built.target),
            pipeline=self.built.pipeline, total_us=capture.total_us, metadata=dict(metadata or {}))
        return write_dump(Path(path), content, overwrite=overwrite)

    def _device_label(self) -> str:
        kind = self.built.target.kind.name
        return {"llvm": "CPU", "c": "CPU"}.get(kind, kind.upper()) + "_0"

    def __repr__(self) -> str:
        ran = "ran" if self._capture is not None else "not run"
        return (f"<Probe {len(self.imported.sources)} source values, {len(self.kernel_map.sites)} kernel "
                f"calls, pipeline={self.built.pipeline!r}, target={self.built.target.kind.name}, {ran}>")
