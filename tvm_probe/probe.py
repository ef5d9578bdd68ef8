"""The Probe: import → compile → map → run → serve values by source name.

    probe = Probe.from_onnx("bert.onnx", target="llvm", pipeline="fused")
    probe.run({"input_ids": ids, "attention_mask": mask})
    probe.get("layer_._0/attention/self/MatMul")
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Mapping, Sequence, Union

import numpy as np

from .build import BuiltModel, PipelineLike, compile_with_snapshots
from .capture import Capture, CapturePlanner, DebugExecutor
from .errors import NotCapturedError, NotRunError, ValueUnavailableError
from .inputs import check_inputs
from .importer import ImportedModel, InputSpec
from .kernel_map import ArgKind, KernelMap, PlaceKind, build_kernel_map, classify
from .recompute import evaluate_folded
from .results import NodeInfo, Results
from .sources import Served

log = logging.getLogger(__name__)

CaptureSpec = Union[str, Sequence[str], None]


class Probe(Results):
    """A compiled model whose every intermediate value can be read by its source name.

    Build one with :meth:`from_onnx`; call :meth:`run` once per input; then :meth:`get`,
    :meth:`get_all`, :meth:`get_node_output`, :attr:`sources`, :attr:`nodes`, :meth:`dump`.
    The executable that runs is exactly what ``tvm.compile(mod, target, pipeline)`` builds.

    ``remote=`` runs it on a remote device over TVM RPC (see :mod:`tvm_probe.remote`): the
    executable is uploaded once, every run brings its captures back, and everything else
    (``get``, dumps, reports) is the same.
    """

    def __init__(self, imported: ImportedModel, built: BuiltModel, kernel_map: KernelMap, remote=None):
        from dataclasses import replace

        # How a value is served belongs to this build: two probes of one import must not share it.
        imported = replace(imported, sources=imported.sources.copy())
        self.imported, self.built, self.kernel_map = imported, built, kernel_map
        self._executor = DebugExecutor(built, kernel_map, sources=imported.sources, remote=remote)
        self._recomputer = self._executor.recomputer([s.group for s in kernel_map.sites if s.group is not None])
        self._capture: Capture | None = None
        self._wanted: set[str] | None = None
        self._values: dict[str, np.ndarray] = {}
        self._folded: dict[str, np.ndarray] = {}
        classify(imported.sources, kernel_map, self.num_input_nodes)
        self._init_results(imported.sources, self._static_nodes())
        self._planner = CapturePlanner(kernel_map, self._names)
        self._symbolic = any(isinstance(d, str) for n in self.node_infos for shape in n.out_shapes for d in shape)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_onnx(cls, model, target="llvm", pipeline: PipelineLike = "default",
                  shapes: Mapping[str, Sequence[int]] | None = None, import_fixes: bool = True,
                  remote=None) -> "Probe":
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
        """
        from .importer.onnx import import_onnx

        shapes = {k: tuple(v) for k, v in (shapes or {}).items()}
        return cls.from_imported(import_onnx(model, shapes, import_fixes=import_fixes), target, pipeline, remote)

    @classmethod
    def from_torch(cls, module, example_inputs, target="llvm", pipeline: PipelineLike = "default",
                   import_fixes: bool = True, remote=None) -> "Probe":
        """Export a ``torch.nn.Module`` with ``torch.export`` and compile it for ``target``.

        Values answer to their fx node names (``bmm_3``) and module paths
        (``bert.encoder.layer.0.attention``: the module's output).  Needs ``tvm_probe[torch]``.

        Args:
            module: the model (put it in ``eval()`` mode first for inference behaviour).
            example_inputs: a tuple of tensors (the shapes are compiled statically).
            target, pipeline, import_fixes, remote: as for :meth:`from_onnx`.
        """
        from .importer.torch import import_torch

        return cls.from_imported(import_torch(module, example_inputs, import_fixes=import_fixes), target, pipeline,
                                 remote)

    @classmethod
    def from_tflite(cls, model, target="llvm", pipeline: PipelineLike = "default",
                    shapes: Mapping[str, Sequence[int]] | None = None, remote=None) -> "Probe":
        """Import a TFLite model (path or bytes) and compile it for ``target``.

        Values answer to their TFLite tensor names, which are TensorFlow's op names
        (``layer_._0/attention/self/MatMul``); a name the converter merged (``a;b``) answers to
        each part too.  Needs ``tvm_probe[tflite]``.

        Args:
            model: a ``.tflite`` path or the file's bytes.
            target, pipeline, remote: as for :meth:`from_onnx`.
            shapes: static shapes for inputs, overriding those the model declares.
        """
        from .importer.tflite import import_tflite

        shapes = {k: tuple(v) for k, v in (shapes or {}).items()}
        return cls.from_imported(import_tflite(model, shapes), target, pipeline, remote)

    @classmethod
    def from_imported(cls, imported: ImportedModel, target="llvm", pipeline: PipelineLike = "default",
                      remote=None) -> "Probe":
        """Compile a model an importer produced (what the ``from_*`` constructors do after importing).

        A ``remote`` device is connected to first, so that a wrong address fails before the compile.
        """
        if remote is not None:
            from .remote import connect

            remote = connect(remote)
        built = compile_with_snapshots(imported.mod, target, pipeline, imported=imported)
        return cls(imported, built, build_kernel_map(imported, built.snapshots), remote=remote)

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

    def verify(self, inputs):
        """Check every value this probe serves against an independent, unfused evaluation.

        Runs the model on ``inputs`` (capturing everything), builds the imported module again
        without FoldConstant and FuseOps and compares each served value with the one that build
        computes.  A mismatch is a tvm_probe problem (please report it), not a TVM divergence.
        Costs about one extra compile and one unfused run.

        Returns:
            A :class:`~tvm_probe.verify.Verification`, truthy when nothing disagreed;
            ``.summary()`` is one line.
        """
        from .verify import verify

        return verify(self, inputs)

    @property
    def pipeline(self) -> str:
        return self.built.pipeline

    @property
    def num_input_nodes(self) -> int:
        return len(self.imported.inputs)

    def _static_nodes(self) -> list[NodeInfo]:
        n_in = self.num_input_nodes
        nodes = [NodeInfo(index=i, name=s.name, op="null", out_shapes=[s.shape], out_dtypes=[s.dtype],
                          output_keys=[[s.name]]) for i, s in enumerate(self.imported.inputs)]
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
            **dump_options) -> dict[str, np.ndarray]:
        """Run the deployed executable once and capture intermediate values.

        Args:
            inputs: ``{input name: array}``, a list in :attr:`inputs` order, or one array for
                a model with one input.
            capture: ``"all"``; a name, pattern or list of them (then only what those values
                need is copied: their kernel outputs, or the inputs of the kernels that keep
                them inside); or ``None`` for no capture at all (per-kernel times only).
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
        arrays = check_inputs(self.imported.inputs, inputs, allow_nonfinite)
        plan, wanted = self._planner.plan(capture)
        if dump_options and stream_to is None:
            raise TypeError(f"run() got dump options {sorted(dump_options)} without stream_to")
        # Values kept inside fused kernels will be recomputed from this run: build their cut
        # modules meanwhile (once per probe) instead of on the first read.
        build = self._recomputer.build_alongside() if self._planner.recomputes(wanted) else None
        try:
            if stream_to is not None:
                from .store.assemble import DumpOptions, run_streaming

                run_streaming(self, arrays, plan, wanted, Path(stream_to), DumpOptions(**dump_options))
            else:
                self._accept(self._executor.run(arrays, plan), wanted)
        finally:
            if build is not None:
                _join_build(build)
        return dict(zip(self.imported.sources.model_outputs, self._capture.result))

    def _accept(self, capture: Capture, wanted: set[str] | None) -> None:
        """Make ``capture`` (which copied what ``wanted`` needs) the run values are served from.

        Only a run that completed gets here: a failed one leaves the previous run in place.
        """
        self._capture, self._wanted, self._values = capture, wanted, {}
        n_in, time_us, start_us = self.num_input_nodes, capture.time_us, capture.start_us
        for node in self.node_infos[n_in:]:
            node.time_us = time_us.get(node.index - n_in)
            node.start_us = start_us.get(node.index - n_in)
        if self._symbolic:
            self._record_sizes(capture)

    def _record_sizes(self, capture: Capture) -> None:
        """Symbolic dimensions: the nodes take this run's sizes where the run shows them."""
        n_in = self.num_input_nodes
        for node, array in zip(self.node_infos[:n_in], capture.inputs):
            node.out_shapes = [tuple(array.shape)]
        for node in self.node_infos[n_in:]:
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
        value = self.imported.sources[key]
        served = value.served
        place = self.kernel_map.places.get(key)
        if served is Served.INPUT:
            return capture.inputs[value.node_index]
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
                self._values.update(self._recompute(self.kernel_map.sites[place.site], key))
            return self._values[key]
        if served is Served.UNKNOWN:
            raise ValueUnavailableError(
                f"tvm_probe cannot tell where the compiled module holds {value.display_name!r} "
                f"({self.kernel_map.lost.get(key, 'no place found')}); rather than guess, it serves "
                "nothing: please report this with the model")
        raise ValueUnavailableError(
            f"{value.display_name!r} is dead code: no output of the source model depends on it, "
            "so the compiled module never computes it")

    def _evaluate_folded(self) -> dict[str, np.ndarray]:
        """Every value the pipeline folded: constants as they are, the rest in one build."""
        places = {k: p for k, p in self.kernel_map.places.items() if self.imported.sources[k].served is Served.FOLDED}
        values = {k: p.const.value.numpy() for k, p in places.items() if p.kind is PlaceKind.CONSTANT}
        folded = {k: p.var for k, p in places.items() if p.kind is PlaceKind.FOLDED}
        unique = list(dict.fromkeys(folded.values()))
        if unique:
            # on this machine's CPU, as FoldConstant itself evaluates them (TVM builds them for "llvm")
            from .build import parse_target

            arrays = dict(zip(unique, evaluate_folded(self.built.snapshots.pre_fold, unique, parse_target("llvm"))))
            values.update({k: arrays[v] for k, v in folded.items()})
        return values

    def _recompute(self, site, key: str) -> dict[str, np.ndarray]:
        """Every source value ``site`` keeps inside, from the inputs it received in the last run."""
        inputs = self._site_inputs(site, self.imported.sources[key].display_name)
        places = self.kernel_map.places
        keys = [k for k in site.interior_keys if places[k].kind is PlaceKind.INTERIOR]
        tensors = self._recomputer.interior_values(site, inputs, {places[k].inner for k in keys})
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

        Args:
            overwrite: replace an existing folder (refused by default).
            include_weights: store the weights too (left out by default: they are the model's).
            recomputed: store the values kept inside fused kernels (default True), recomputing
                them now; without them a dump holds what the run itself produced.
            timings: store per-kernel times (default True); they are the one part of a dump
                that differs between runs of the same model, inputs and pipeline.
            metadata: JSON-friendly data to keep with the dump (e.g. where the model came from).
        """
        from .store.assemble import DumpOptions, dump_probe

        return dump_probe(self, path, DumpOptions(**options))

    @property
    def device_label(self) -> str:
        """How dumps name the device: ``CPU_0``, ``CUDA_0``..."""
        kind = self.built.target.kind.name
        return {"llvm": "CPU", "c": "CPU"}.get(kind, kind.upper()) + "_0"

    def __repr__(self) -> str:
        ran = "ran" if self._capture is not None else "not run"
        where = f", remote={self.remote}" if self.remote is not None else ""
        return (f"<Probe {len(self.imported.sources)} source values, {len(self.kernel_map.sites)} kernel "
                f"calls, pipeline={self.built.pipeline!r}, target={self.built.target.kind.name}{where}, {ran}>")


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
