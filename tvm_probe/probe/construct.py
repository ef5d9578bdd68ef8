"""The Probe's constructors: a model imported by the adapter of its kind, compiled, mapped.

:class:`Constructors` is mixed into :class:`~tvm_probe.probe.Probe` (``cls`` is the probe class):
``from_onnx``, ``from_torch``, ``from_tflite``, ``from_relax``, ``from_nn``, ``from_hf`` name the
kind; :meth:`Constructors.from_model` imports any kind (:mod:`tvm_probe.importer.kinds`);
:meth:`~Constructors.from_imported` and :meth:`~Constructors.from_functions` compile what an
importer made (one function, or several in one executable).
"""
from __future__ import annotations

from typing import Mapping, Sequence, TypeVar

from ..build.compile import PipelineLike
from ..build.precision import lower_precision
from ..capture.remote import connect
from ..core.errors import ModelError, ProbeError, TVMError
from ..core.records import built_for_pinned
from ..core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET
from ..diagnose import compile_with_snapshots
from ..importer import ImportedFunctions, ImportedModel, adapter_for, adapter_of
from ..importer.relax import hold_on_device
from ..kernel_map import build_kernel_map
from .functions import as_built, function_built


P = TypeVar("P", bound="Constructors")


class Constructors:
    """The ways to make a Probe (see the module docstring)."""

    @classmethod
    def from_onnx(cls: type[P], model, target=DEFAULT_TARGET, pipeline: PipelineLike = DEFAULT_PIPELINE,
                  shapes: Mapping[str, Sequence[int]] | None = None, import_fixes: bool = True,
                  remote=None, precision=None) -> P:
        """Import an ONNX model (path or ``onnx.ModelProto``) and compile it for ``target``.

        Args:
            model: a ``.onnx`` path or an ``onnx.ModelProto``.
            target: a TVM target: a kind (``"llvm"``, ``"cuda"``), a dict or JSON string with
                options (``{"kind": "cuda", "arch": "sm_90"}``), or a ``tvm.target.Target``.
            pipeline: ``"default"`` (what ``tvm.compile`` uses; unfused on CPU), ``"fused"``
                (``relax.get_default_pipeline(target)``), another name of TVM's
                (``relax.pipeline.PIPELINE_MAP``: ``default_build``, ``zero``...) or any
                ``tvm.transform.Pass``.
            shapes: static shapes for inputs declared with symbolic dimensions (the shape
                arithmetic they fix is folded before TVM sees the model; see importer/static.py).
                Without it, such dimensions stay symbolic where TVM's importer follows them, and
                are pinned to 1 where it cannot (a warning names each; ``probe.imported.pinned``).
            import_fixes: rewrite the constructs TVM 0.27 cannot build (importer/fixes.py);
                :attr:`import_fixes` lists those used.  Defaults to True.
            remote: run on a remote device over TVM RPC: ``{"host": H, "port": P}`` or
                ``{"tracker": "H:P", "key": K}`` of a ``tvm-probe serve`` (see
                :mod:`tvm_probe.capture.remote`).  Defaults to None (this machine).
            precision: build in reduced precision: ``"fp16"``, ``{"dtype": "fp16", "keep_fp32":
                [source names]}`` or a ``tvm.transform.Pass`` (see :mod:`tvm_probe.tools.precision`);
                the same source names are served from that build.  Defaults to None (as imported).
        """
        return cls.from_model(model, "onnx", target, pipeline, remote, precision, shapes=shapes,
                              import_fixes=import_fixes)

    @classmethod
    def from_torch(cls: type[P], module, example_inputs, target=DEFAULT_TARGET,
                   pipeline: PipelineLike = DEFAULT_PIPELINE, import_fixes: bool = True, remote=None,
                   precision=None) -> P:
        """Export a ``torch.nn.Module`` with ``torch.export`` and compile it for ``target``.

        Values answer to their fx node names (``bmm_3``) and module paths
        (``bert.encoder.layer.0.attention``: the module's output).  Needs ``tvm_probe[torch]``.

        Args:
            module: the model (put it in ``eval()`` mode first for inference behaviour).
            example_inputs: a tuple of tensors (the shapes are compiled statically).
            target, pipeline, import_fixes, remote, precision: as for :meth:`from_onnx`.
        """
        return cls.from_model((module, example_inputs), "torch", target, pipeline, remote, precision,
                              import_fixes=import_fixes)

    @classmethod
    def from_tflite(cls: type[P], model, target=DEFAULT_TARGET, pipeline: PipelineLike = DEFAULT_PIPELINE,
                    shapes: Mapping[str, Sequence[int]] | None = None, remote=None, precision=None) -> P:
        """Import a TFLite model (path or bytes) and compile it for ``target``.

        Values answer to their TFLite tensor names, which are TensorFlow's op names
        (``layer_._0/attention/self/MatMul``); a name the converter merged (``a;b``) answers to
        each part too.  Needs ``tvm_probe[tflite]``.

        Args:
            model: a ``.tflite`` path or the file's bytes.
            target, pipeline, remote, precision: as for :meth:`from_onnx`.
            shapes: static shapes for inputs, overriding those the model declares.
        """
        return cls.from_model(model, "tflite", target, pipeline, remote, precision, shapes=shapes)

    @classmethod
    def from_relax(cls: type[P], mod, params: Mapping[str, object] | None = None, target=DEFAULT_TARGET,
                   pipeline: PipelineLike = DEFAULT_PIPELINE) -> P:
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
        return cls.from_model(mod, "relax", target, pipeline, params=params)

    @classmethod
    def from_nn(cls: type[P], module, spec, params: Mapping[str, object] | None = None, target=DEFAULT_TARGET,
                pipeline: PipelineLike = DEFAULT_PIPELINE) -> P:
        """Export a ``tvm.relax.frontend.nn.Module`` with ``export_tvm`` and compile it.

        Values answer to module paths (``model.layers.0.self_attn``: the module's output, as
        ``export_tvm`` traced it), parameters to their dotted names
        (``model.layers.0.mlp.down_proj.weight``), and every binding to its name.

        Args:
            module: the nn.Module.
            spec: what ``export_tvm`` takes (a ``ModuleSpec`` or its dict form), with
                ``param_mode`` ``"plain"`` or ``"packed"``.
            params: ``{dotted name: array}``: the weights, passed by the probe at every call (then
                callers pass only the inputs); or the folder (or ``tensor-cache.json``) of weights
                as MLC stores them (``tvm.contrib.tvmjs.dump_tensor_cache``: raw or float32 as
                bfloat16), every parameter checked against the model.  Without them, pass the
                weights as the compiled function takes them (plain: one argument each; packed: one
                list of tensors).
            target, pipeline: as for :meth:`from_onnx`.
        """
        return cls.from_model(module, "nn", target, pipeline, spec=spec, params=params)

    @classmethod
    def from_hf(cls: type[P], model, pipeline: PipelineLike = DEFAULT_PIPELINE, target=DEFAULT_TARGET,
                max_len: int = 64, import_fixes: bool = True, quantize=None) -> P:
        """A transformers ``*ForCausalLM`` with an explicit KV cache: functions ``prefill`` and
        ``decode`` of one executable (symbolic prompt and past lengths); :meth:`generate` drives
        them.  Values answer to the model's own names, as its ``named_modules()`` and
        ``named_parameters()`` give them (``model.layers.0.self_attn``, ``lm_head``,
        ``model.embed_tokens.weight``), and to fx node names.  See :mod:`tvm_probe.importer.hf`.

        Args:
            model: the causal LM (its weights as they are; put in eval mode).
            pipeline, target, import_fixes: as for :meth:`from_torch`.
            max_len: the longest prompt + generated length :meth:`generate` accepts.
            quantize: weight-only quantization as MLC-LLM deploys it: ``"q4f32_1"``,
                ``"q4f16_1"`` or a :class:`~tvm_probe.importer.quantize.QuantSpec`; every
                ``nn.Linear`` and the token embedding then take parameters ``<path>.q_weight``
                (packed uint32) and ``<path>.q_scale``, which the probe holds and the compiled
                kernels unpack and scale; ``<path>.weight`` names the dequantized weight.  See
                :mod:`tvm_probe.importer.quantize`.  Defaults to None (the weights as they are).
        """
        return cls.from_model(model, "hf", target, pipeline, max_len=max_len, import_fixes=import_fixes,
                              quantize=quantize)

    @classmethod
    def from_model(cls: type[P], model, kind: str | None = None, target=DEFAULT_TARGET,
                   pipeline: PipelineLike = DEFAULT_PIPELINE, remote=None, precision=None, **options) -> P:
        """Import ``model`` with the adapter of ``kind`` (default: the kind of the object; see
        :mod:`tvm_probe.importer.kinds`) and compile it: what every ``from_*`` constructor does.
        ``options`` are what that kind's import takes (``shapes=``, ``import_fixes=``; relax:
        ``params=``; nn: ``spec=``, ``params=``; hf: ``max_len=``, ``import_fixes=``)."""
        adapter = adapter_for(kind) if kind is not None else adapter_of(model)
        if not adapter.functions:
            return cls.from_imported(adapter.import_model(model, **options), target, pipeline, remote, precision)
        if remote is not None or precision is not None:
            raise ProbeError(f"remote= and precision= take a model of one function, not {adapter.described}")
        return cls.from_functions(adapter.import_functions(model, **options), target, pipeline)

    @classmethod
    def from_functions(cls: type[P], functions: ImportedFunctions, target=DEFAULT_TARGET,
                       pipeline: PipelineLike = DEFAULT_PIPELINE) -> P:
        """One compile of ``functions.mod``; a function probe per function of the executable;
        the first is the one returned (:attr:`functions` has them all).  A pipeline may rename,
        add and remove functions (MLC-LLM's ``DispatchKVCacheCreation``): the probe follows the
        executable as built (:func:`~tvm_probe.probe.functions.as_built`)."""
        models = functions.models
        if not models:
            raise ModelError("the module has no Relax function to run (every one is called by another): "
                             "give the entry function a global_symbol")
        built = compile_with_snapshots(functions.mod, target, pipeline)
        # the executable's functions, as the pipeline left them (renamed, added, removed: functions.py)
        executable = as_built(models, functions.mod, built)
        hold_on_device(executable.models, built.device)
        before = {new: old for old, new in executable.renamed.items()}
        probes = {}
        for name, model in executable.models.items():
            fbuilt = function_built(built, name, imported_as=before.get(name))
            kernel_map = build_kernel_map(model, fbuilt.snapshots)
            executable.explain(name, kernel_map)
            probes[name] = cls(model, fbuilt, kernel_map)
        return cls.serving_functions(probes, functions.hf, executable, functions.serving)

    @classmethod
    def from_imported(cls: type[P], imported: ImportedModel, target=DEFAULT_TARGET,
                      pipeline: PipelineLike = DEFAULT_PIPELINE, remote=None, precision=None) -> P:
        """Compile a model an importer produced (what the ``from_*`` constructors do after importing).

        A ``remote`` device is connected to first, so that a wrong address fails before the compile.
        ``precision`` (see :meth:`from_onnx`) converts the module before the pipeline compiles it.
        """
        if remote is not None:
            remote = connect(remote)
        lowered = None
        if precision is not None:
            imported, lowered = lower_precision(imported, precision)
        try:
            built = compile_with_snapshots(imported.mod, target, pipeline, imported=imported)
        except TVMError as err:  # sizes tvm_probe chose (1) may not fit the model (a CNN's width)
            if imported.pinned and err.remedy is None:
                raise err.with_remedy(built_for_pinned(imported.pinned)) from None
            raise
        return cls(imported, built, build_kernel_map(imported, built.snapshots), remote=remote, precision=lowered)
