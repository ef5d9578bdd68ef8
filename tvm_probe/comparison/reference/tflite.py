"""Reference values from the TFLite interpreter, and comparison against TF-named references.

:func:`tflite_values` runs a ``.tflite`` model in the TFLite interpreter (``ai-edge-litert``,
else ``tflite-runtime``, else TensorFlow's own ``tf.lite``) with every intermediate tensor kept
(``experimental_preserve_all_tensors=True``) and the default delegates off, so that each op's
kernel writes its own output tensor.  Values are keyed exactly like
:func:`tvm_probe.importer.tflite.import_tflite` keys them (:func:`tensor_keys`), so
``compare(probe, tflite_values(path, inputs))`` lines every tensor up by name.

:func:`compare_tf_names` is for a reference keyed by *TensorFlow* names (``scope/op:0``, e.g. what
TensorFlow itself computed) against a probe of a converted model (tf2onnx ONNX or TFLite).
Converters move names: tf2onnx folds a BiasAdd of zeros away and merges MatMul + BiasAdd into
one Gemm, the TFLite converter merges names (``a;b``), and some names end up on a different value
(tf2onnx puts ``moments/SquaredDifference`` on the subtraction before squaring).  Every TF name
is therefore reported — compared, or listed as unchecked with the reason — never silently dropped.
"""
from __future__ import annotations

import re
import warnings
from typing import Mapping, Sequence

import numpy as np

from ...core.errors import InputError, ModelError, ProbeError, one_line
from ...core.install import install_hint
from ...core.tolerance import Tolerance
from ...importer.tflite import load_tflite, signature_keys, tensor_keys
from ..verdict import Comparison, compare_arrays


def _interpreter_module():
    """The first installed interpreter package: ai-edge-litert, tflite-runtime, TensorFlow."""
    for name in ("ai_edge_litert.interpreter", "tflite_runtime.interpreter"):
        try:
            return __import__(name, fromlist=["Interpreter"])
        except ImportError:
            continue
    try:
        import tensorflow as tf
    except ImportError:
        raise ModelError(f"no TFLite interpreter is installed: {install_hint('tflite')} "
                         "(ai-edge-litert; tflite-runtime or tensorflow work too)") from None
    return tf.lite


def tflite_values(model, inputs: Mapping[str, np.ndarray] | Sequence[np.ndarray],
                  names=None) -> dict[str, np.ndarray]:
    """Run ``model`` in the TFLite interpreter and return ``{tensor key: value}``.

    Args:
        model: a ``.tflite`` path or the file's bytes.
        inputs: ``{input name: array}`` or a list in the model's input order.
        names: tensor keys to return; default every tensor of the main subgraph (weights too).

    Raises:
        ModelError: no interpreter is installed, or it cannot run the model;
        InputError: the inputs do not fit the model.
    """
    parsed = load_tflite(model)
    keys = tensor_keys(parsed.subgraph)
    interp = _interpreter(parsed)
    details = {d["index"]: d for d in interp.get_tensor_details()}
    if isinstance(inputs, Mapping):  # signature keys (input_ids) stand for their tensors
        by_key = {name: keys[t] for t, names in signature_keys(parsed.model, keys).items() for name in names}
        inputs = {by_key.get(k, k) if k not in keys else k: v for k, v in inputs.items()}
    for index, array in _feeds(interp, inputs).items():
        interp.set_tensor(index, array)
    try:
        interp.invoke()
    except Exception as err:
        raise ModelError(f"the TFLite interpreter cannot run {parsed.label}: {one_line(err)}") from None
    wanted = set(names) if names is not None else None
    values = {}
    for index, key in enumerate(keys):
        if wanted is not None and key not in wanted:
            continue
        detail = details.get(index)
        if detail is None or detail["name"] != (parsed.subgraph.Tensors(index).Name() or b"").decode():
            raise ModelError(f"the TFLite interpreter numbers the tensors of {parsed.label} differently from "
                             f"the file (tensor {index} is {key!r}); tvm_probe cannot tell which value is which")
        try:
            values[key] = np.array(interp.get_tensor(index))  # a copy: the interpreter owns its buffer
        except ValueError:
            continue  # no data: an optional or scratch tensor
    return values


def _interpreter(parsed):
    module = _interpreter_module()
    resolver = getattr(module, "OpResolverType", None)
    options = {"experimental_preserve_all_tensors": True, "num_threads": 1}
    if resolver is not None:  # delegates (XNNPACK) would compute fused kernels, not each tensor
        options["experimental_op_resolver_type"] = resolver.BUILTIN_WITHOUT_DEFAULT_DELEGATES
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            interp = module.Interpreter(model_content=parsed.content, **options)
            interp.allocate_tensors()
    except Exception as err:
        raise ModelError(f"the TFLite interpreter cannot load {parsed.label}: {one_line(err)}") from None
    return interp


def _feeds(interp, inputs) -> dict[int, np.ndarray]:
    """Tensor index → array for every model input, checked against the interpreter's inputs."""
    specs = interp.get_input_details()
    expected = ", ".join(f"{s['name']} {np.dtype(s['dtype'])}{s['shape'].tolist()}" for s in specs)
    if isinstance(inputs, Mapping):
        missing = [s["name"] for s in specs if s["name"] not in inputs]
        extra = [n for n in inputs if n not in {s["name"] for s in specs}]
        if missing or extra:
            what = f"missing input(s) {missing}" if missing else f"unknown input(s) {extra}"
            raise InputError(f"{what}: the TFLite model takes {expected}")
        arrays = [inputs[s["name"]] for s in specs]
    else:
        arrays = list(inputs)
        if len(arrays) != len(specs):
            raise InputError(f"got {len(arrays)} inputs, the TFLite model takes {len(specs)}: {expected}")
    feeds = {}
    for spec, value in zip(specs, arrays):
        array = np.asarray(value)
        if array.dtype != np.dtype(spec["dtype"]) or list(array.shape) != spec["shape"].tolist():
            raise InputError(f"input {spec['name']!r} is {array.dtype}{list(array.shape)}, the TFLite model "
                             f"takes {np.dtype(spec['dtype'])}{spec['shape'].tolist()}")
        feeds[spec["index"]] = np.require(array, requirements="C")  # ascontiguousarray makes 0-d 1-d
    return feeds


# -- references keyed by TensorFlow names ----------------------------------------------------
_OUTPUT_SUFFIX = re.compile(r":(\d+)$")


def _tf_candidates(tf_name: str) -> list[str]:
    """Names a model may give the TF tensor ``op:k``: itself, and the op name for output 0."""
    match = _OUTPUT_SUFFIX.search(tf_name)
    if match is None:
        return [tf_name, f"{tf_name}:0"]
    return [tf_name, tf_name[: match.start()]] if match.group(1) == "0" else [tf_name]


def compare_tf_names(results, tf_values: Mapping[str, np.ndarray], converted: Mapping[str, np.ndarray] | None = None,
                     atol: float | None = None, rtol: float | None = None) -> Comparison:
    """Compare a probe (or dump) with values keyed by TensorFlow names; report every name.

    A TF name lines up with the model value that answers to it *exactly* (``op:0`` or ``op``;
    no suffix matching, which could pick a different op).  Each lined-up name is compared: a
    different shape or value is a failed comparison with a note, because after conversion a TF
    name may sit on a different value.  A name that is one part of a merged TFLite name is noted
    as such: the tensor holds the fused op's output, not necessarily that op's own value.  A
    name no value answers to is listed in ``unchecked`` with why.

    Args:
        results: a :class:`~tvm_probe.Probe` after ``run``, or a dump.
        tf_values: ``{TF tensor or op name: value}``, e.g. what TensorFlow computed.
        converted: the converted model's own values from its runtime, keyed like ``results``
            (``onnxruntime_values`` for a tf2onnx model, :func:`tflite_values` for TFLite).
            With it, a TF name whose value differs is told apart: when the converted model
            computes what TVM computes, the converter moved the name (noted, and not taken as
            the first divergent op); otherwise TVM diverges.
        atol, rtol: one tolerance for every value (default: by dtype).

    Returns:
        A :class:`~tvm_probe.comparison.Comparison` with one entry per lined-up TF name (``name``
        is the TF name, ``key`` the model's tensor), in the model's source order.
    """
    owners = _exact_names(results)
    out = Comparison()
    found = []
    for tf_name in tf_values:
        key = next((owners[n] for n in _tf_candidates(tf_name) if n in owners), None)
        if key is None:
            out.unchecked[tf_name] = ("no value of the model has this TF name: the converter removed or "
                                    "renamed the op (e.g. tf2onnx folds a BiasAdd of zeros and merges "
                                    "MatMul + BiasAdd into Gemm; the TFLite converter fuses ops)")
            continue
        found.append((key, tf_name))
    order = {v.key: i for i, v in enumerate(results.sources_map)}
    tolerance = Tolerance(atol, rtol) if atol is not None and rtol is not None else None
    for key, tf_name in sorted(found, key=lambda f: order[f[0]]):
        _compare_one(results, key, tf_name, tf_values[tf_name], converted, tolerance, out)
    return out


def _exact_names(results) -> dict[str, str]:
    """Every name of every value → its key; names shared by several values are left out."""
    owners: dict[str, str] = {}
    shared = set()
    for value in results.sources_map:
        for name in value.names:
            if owners.setdefault(name, value.key) != value.key:
                shared.add(name)
    return {n: k for n, k in owners.items() if n not in shared}


def _compare_one(results, key: str, tf_name: str, ref: np.ndarray, converted, tolerance, out: Comparison) -> None:
    try:
        got = results.get_tensor(key)
    except ProbeError as err:
        out.unchecked[tf_name] = str(err)
        return
    cmp = compare_arrays(key, tf_name, results.servings[key].served.value, got, ref, tolerance)
    notes = [cmp.note] if cmp.note else []
    if tf_name not in (key, f"{key}:0") and ";" in key:
        notes.append(f"one of the merged names of {key!r}: the tensor holds the fused op's output")
    moved = False
    if not cmp.passed:
        note, moved = _why_different(cmp, got, converted.get(key) if converted is not None else None, tolerance)
        notes.append(note)
    cmp.note = "; ".join(notes)
    out.values.append(cmp)
    out.names[tf_name] = tf_name
    if not cmp.passed and not moved and out.first_divergent is None:
        out.first_divergent = cmp


def _why_different(cmp, got: np.ndarray, converted_value, tolerance) -> tuple[str, bool]:
    """A note on a failed TF-name comparison, and whether the converter (not TVM) explains it."""
    if converted_value is not None:
        same = compare_arrays(cmp.key, cmp.name, cmp.served, got, converted_value, tolerance).passed
        if same:
            return ("the converted model's own runtime computes the same as TVM: the converter put this TF "
                    "name on a different value (not a TVM divergence)"), True
        return "TVM differs from the converted model's own runtime too: TVM diverges here", False
    if cmp.note.startswith("shape"):
        return "the TF name sits on a different value after conversion", False
    return ("values differ: TVM diverges here, or the converter put this TF name on a different value "
            "(pass converted= to tell)"), False
