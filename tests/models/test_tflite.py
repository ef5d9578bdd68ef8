"""TFLite models: probed by their TF op names, checked against the TFLite interpreter.

The models in ``tests/support/tflite_models`` were made by ``make_models.py`` there (TensorFlow 2.18,
in a virtual environment of its own); they are shipped so these tests need no TensorFlow.  For
each model there is the ``.tflite`` file, tf2onnx's ``.onnx`` of the same function, and what
TensorFlow itself computed for every op output (``*_tf.npz``, keyed by TF tensor names).

References, all independent of TVM: the TFLite interpreter (skipped with a reason when none is
installed), onnxruntime on the tf2onnx model (where names line up), TensorFlow's own values.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tvm_probe.core.install import install_hint
from tvm_probe.core.schema import PIPELINES

pytest.importorskip("tflite", reason=f"TVM's TFLite importer needs the 'tflite' package: {install_hint('tflite')}")

from tvm_probe import (AmbiguousNameError, InputError, ModelError, Probe,  # noqa: E402
                       UnsupportedOpError, load_dump)
from tvm_probe.comparison.verdict import compare  # noqa: E402
from tvm_probe.importer.tflite import import_tflite, load_tflite, shape_differences  # noqa: E402
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values  # noqa: E402
from tvm_probe.comparison.reference.tflite import compare_tf_names, tflite_values  # noqa: E402
from tvm_probe.core.sources import Kind  # noqa: E402

from support.processes import run_cli, run_python  # noqa: E402
from support import SUPPORT  # noqa: E402

MODELS = SUPPORT / "tflite_models"
NAMES = ["bert", "cnn"]
ATOL = 1e-4


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ValueError:  # blocked with sys.modules[module] = None
        return False


HAS_INTERPRETER = any(_installed(m) for m in ("ai_edge_litert", "tflite_runtime", "tensorflow"))
needs_interpreter = pytest.mark.skipif(
    not HAS_INTERPRETER, reason=f"no TFLite interpreter installed ({install_hint('tflite')}); "
                                "the onnxruntime comparisons of the tf2onnx models still run")


def _path(name: str, ext: str = "tflite") -> Path:
    return MODELS / f"{name}.{ext}"


def _tf(name: str) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(model inputs, TensorFlow's value of every op output by TF tensor name)."""
    with np.load(MODELS / f"{name}_tf.npz") as data:
        arrays = {k: data[k] for k in data.files}
    inputs = {k[len("input:"):]: v for k, v in arrays.items() if k.startswith("input:")}
    return inputs, {k: v for k, v in arrays.items() if not k.startswith("input:")}


_PROBES: dict[tuple[str, str], Probe] = {}


def _probe(name: str, pipeline: str) -> Probe:
    """One probe per model and pipeline, built once, after one run capturing everything."""
    if (name, pipeline) not in _PROBES:
        probe = Probe.from_tflite(_path(name), pipeline=pipeline)
        probe.run(_tf(name)[0])
        _PROBES[name, pipeline] = probe
    return _PROBES[name, pipeline]


def _computed(probe: Probe) -> list[str]:
    return [v.key for v in probe.sources_map if v.kind is Kind.VALUE]


def _fully_connected_flattening(path: Path) -> set[str]:
    """Outputs of FULLY_CONNECTED ops with keep_num_dims=False on an input of rank > 2, read
    from the file alone: where TVM 0.27 keeps dims TFLite flattens."""
    from tflite.BuiltinOperator import BuiltinOperator
    from tflite.FullyConnectedOptions import FullyConnectedOptions

    model = load_tflite(path)
    sub, found = model.subgraph, set()
    for i in range(sub.OperatorsLength()):
        op = sub.Operators(i)
        code = model.model.OperatorCodes(op.OpcodeIndex())
        if max(code.BuiltinCode(), code.DeprecatedBuiltinCode()) != BuiltinOperator.FULLY_CONNECTED:
            continue
        options = FullyConnectedOptions()
        options.Init(op.BuiltinOptions().Bytes, op.BuiltinOptions().Pos)
        if not options.KeepNumDims() and sub.Tensors(op.Inputs(0)).ShapeLength() > 2:
            found.add(sub.Tensors(op.Outputs(0)).Name().decode())
    return found


# -- import ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_tagged_import_is_structurally_identical_to_a_plain_import(name):
    import tvm
    from tvm.relax.frontend.tflite import from_tflite

    tagged = import_tflite(_path(name)).mod
    plain = from_tflite(load_tflite(_path(name)).model)
    tvm.ir.assert_structural_equal(plain, tagged, map_free_vars=True)


@pytest.mark.parametrize("name", NAMES)
def test_every_tflite_tensor_is_a_source_value(name):
    model = load_tflite(_path(name))
    sub = model.subgraph
    imported = import_tflite(_path(name))
    used = {int(t) for i in range(sub.OperatorsLength()) for t in (*sub.Operators(i).InputsAsNumpy(),
                                                                  *sub.Operators(i).OutputsAsNumpy()) if t >= 0}
    names = {sub.Tensors(t).Name().decode() for t in used}
    assert {v.key for v in imported.sources} == names
    tagged = {k for keys in imported.var_keys.values() for k in keys}
    assert {v.key for v in imported.sources if v.kind in (Kind.VALUE, Kind.INPUT)} == tagged
    assert imported.sources.model_outputs == [sub.Tensors(int(t)).Name().decode() for t in sub.OutputsAsNumpy()]


def test_shape_differences_are_the_fully_connected_ops_tvm_does_not_flatten():
    """TVM 0.27 ignores keep_num_dims=False; the importer reports it (and warns) rather than hide it."""
    differences = shape_differences(_path("bert"), import_tflite(_path("bert")))
    assert set(differences) == _fully_connected_flattening(_path("bert")) != set()
    for declared, served in differences.values():
        assert int(np.prod(declared)) == int(np.prod(served))


# -- values against independent references ------------------------------------------------------
@needs_interpreter
@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", NAMES)
def test_every_served_value_equals_the_tflite_interpreter(name, pipeline):
    probe = _probe(name, pipeline)
    inputs, _ = _tf(name)
    reference = tflite_values(_path(name), inputs)
    reshaped = shape_differences(_path(name), probe.imported)
    checked = _computed(probe)
    assert len(checked) > (80 if name == "bert" else 8)
    assert not [k for k in checked if probe.served(k) in ("unavailable", "unknown")]
    for key in checked:
        got = probe.get_tensor(key)
        if key in reshaped:  # TVM's shape, TFLite's elements: compare them, and the declared shape
            assert reference[key].shape == reshaped[key][0], key
            got = got.reshape(reference[key].shape)
        np.testing.assert_allclose(got, reference[key], atol=ATOL, err_msg=f"{name} {pipeline} {key}")


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", NAMES)
def test_values_equal_onnxruntime_on_the_tf2onnx_model_where_names_line_up(name, pipeline):
    """A TFLite tensor lines up with the tf2onnx tensor ``<name>:0`` when both have the shape and
    onnxruntime's value is TensorFlow's own (tf2onnx put no other value under that name)."""
    probe = _probe(name, pipeline)
    inputs, tf_values = _tf(name)
    ort = onnxruntime_values(_path(name, "onnx"), inputs)
    lined_up = []
    for key in _computed(probe):
        onnx_name = f"{key}:0"
        if onnx_name not in ort or ort[onnx_name].shape != probe.sources_map[key].shape:
            continue
        if onnx_name in tf_values and not np.allclose(ort[onnx_name], tf_values[onnx_name], atol=ATOL):
            continue  # tf2onnx moved the name (e.g. moments/SquaredDifference is its Sub)
        lined_up.append(key)
        np.testing.assert_allclose(probe.get_tensor(key), ort[onnx_name], atol=ATOL, err_msg=key)
    if name == "bert":
        assert len(lined_up) > 40
    (output,) = probe.imported.sources.model_outputs
    (ort_output,) = onnxruntime_values(_path(name, "onnx"), inputs, names=[]).values()
    np.testing.assert_allclose(probe.get(output), ort_output, atol=ATOL)


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("name", NAMES)
def test_verify_passes(name, pipeline):
    result = _probe(name, pipeline).verify(_tf(name)[0])
    assert result, result.summary()
    assert result.checked == len(_computed(_probe(name, pipeline)))


@needs_interpreter
def test_compare_with_the_interpreter_reports_exactly_the_reshaped_tensors():
    probe = _probe("bert", "fused")
    comparison = compare(probe, tflite_values(_path("bert"), _tf("bert")[0]))
    assert {v.key for v in comparison.failed} == set(shape_differences(_path("bert"), probe.imported))
    assert all(v.note.startswith("shape") for v in comparison.failed)
    assert len(comparison.values) == len(_computed(probe))


# -- names ---------------------------------------------------------------------------------------
def test_tf_names_resolve_by_suffix_and_merged_names_answer_to_each_part():
    probe = _probe("bert", "fused")
    scope = "tf_bert_for_sequence_classification/bert/encoder/layer_._0/attention/self"
    assert probe.resolve("layer_._0/attention/self/MatMul") == f"{scope}/MatMul"
    assert probe.sources_map[f"{scope}/MatMul"].op_type == "BATCH_MATMUL"
    merged = f"{scope}/key/MatMul;{scope}/key/BiasAdd"
    assert probe.sources_map[merged].op_type == "FULLY_CONNECTED"
    for name in (merged, f"{scope}/key/BiasAdd", "layer_._0/attention/self/key/MatMul",
                 "layer_._0/attention/self/key/BiasAdd"):
        assert probe.resolve(name) == merged, name
    np.testing.assert_array_equal(probe.get("layer_._0/attention/self/key/BiasAdd"), probe.get_tensor(merged))
    with pytest.raises(AmbiguousNameError, match=r"^'attention/self/key/BiasAdd' names 2 different values: "):
        probe.resolve("attention/self/key/BiasAdd")  # layers 0 and 1: parts follow the usual rules
    assert set(probe.get_all("layer_._0/attention/self/*/BiasAdd")) == {
        f"{scope}/{head}/MatMul;{scope}/{head}/BiasAdd" for head in ("query", "key", "value")}


def test_weights_named_after_ops_do_not_take_the_ops_names():
    """The converter names a conv's bias ``conv1/Relu;conv1/BiasAdd;conv1/Conv2D``: its parts
    name the conv's output, not the bias."""
    probe = _probe("cnn", "default")
    for part in ("cnn/conv1/Relu", "conv1/BiasAdd"):
        value = probe.sources_map[probe.resolve(part)]
        assert value.op_type == "CONV_2D" and value.kind is Kind.VALUE, part


def test_a_dump_answers_to_merged_name_parts(tmp_path):
    probe = _probe("bert", "fused")
    reader = load_dump(probe.dump(tmp_path / "dump"))
    for name in ("layer_._1/attention/self/value/BiasAdd", "layer_._0/intermediate/Gelu/Erf",
                 "layer_._0/attention/self/Softmax"):
        np.testing.assert_array_equal(reader.get(name), probe.get(name), err_msg=name)


# -- references keyed by TF names ---------------------------------------------------------------
def test_tf_names_that_tf2onnx_moves_are_reported_not_hidden():
    inputs, tf_values = _tf("bert")
    probe = Probe.from_onnx(_path("bert", "onnx"), pipeline="fused")
    probe.run(inputs)
    converted = onnxruntime_values(_path("bert", "onnx"), inputs)
    result = compare_tf_names(probe, tf_values, converted=converted)
    assert len(result.values) + len(result.unchecked) == len(tf_values)  # every TF name accounted for
    moved = {v.name for v in result.failed if "the converter put this TF name on a different value" in v.note}
    squared = "tf_bert_for_sequence_classification/bert/embeddings/LayerNorm/moments/SquaredDifference:0"
    assert squared in moved  # tf2onnx names the subtraction before squaring SquaredDifference
    assert result.first_divergent is None  # TVM computes what onnxruntime does: no TVM divergence
    # the zero bias of the classifier: tf2onnx folds the BiasAdd away, its name vanishes
    assert "tf_bert_for_sequence_classification/classifier/dense/BiasAdd:0" in result.unchecked


@needs_interpreter
def test_tf_names_on_a_tflite_model_report_merged_parts_and_tvm_shape_bugs():
    inputs, tf_values = _tf("bert")
    probe = _probe("bert", "default")
    result = compare_tf_names(probe, tf_values, converted=tflite_values(_path("bert"), inputs))
    assert len(result.values) + len(result.unchecked) == len(tf_values)
    gelu = "tf_bert_for_sequence_classification/bert/encoder/layer_._0/intermediate/Gelu/Erf:0"
    (erf,) = [v for v in result.values if v.name == gelu]
    assert not erf.passed and "one of the merged names of" in erf.note
    assert "the converter put this TF name on a different value" in erf.note
    # TVM's FULLY_CONNECTED shape is the one divergence from the interpreter itself
    first = result.first_divergent
    assert first is not None and first.key in shape_differences(_path("bert"), probe.imported)
    assert "TVM differs from the converted model's own runtime too" in first.note


# -- TF >= 2.19: exact GELU as Erfc ---------------------------------------------------------------
def test_the_erfc_gelu_of_tf_2_21_is_refused_in_onnx_and_works_in_tflite():
    """make_models.py with TF 2.21 wrote both files; tf2onnx 1.17 left an Erfc node in the ONNX."""
    import math

    with pytest.raises(UnsupportedOpError, match=r"^node 'model/Gelu/Erfc' has op type Erfc, .*: Erfc is not an "
                                                 r"ONNX op: TF >= 2\.19 writes exact GELU with Erfc"):
        Probe.from_onnx(_path("gelu_erfc", "onnx"))
    with pytest.raises(ModelError, match=r"No Op registered for Erfc"):
        onnxruntime_values(_path("gelu_erfc", "onnx"), {"x": np.zeros((2, 4), np.float32)})
    probe = Probe.from_tflite(_path("gelu_erfc"), pipeline="fused")
    x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)
    probe.run({"x": x})
    (output,) = probe.imported.sources.model_outputs
    assert probe.sources_map[output].op_type == "GELU"
    exact = x * 0.5 * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))
    np.testing.assert_allclose(probe.get(output), exact, atol=1e-6)


# -- errors --------------------------------------------------------------------------------------
def test_bad_files_are_one_line_model_errors(tmp_path):
    onnx_file = _path("bert", "onnx")
    with pytest.raises(ModelError, match=rf"^'{onnx_file}' is not a TFLite model \(no 'TFL3' file identifier\): "
                                         r"give a \.tflite file$"):
        Probe.from_tflite(onnx_file)
    with pytest.raises(ModelError, match=r"^model file '.*nope\.tflite' does not exist: check the path$"):
        import_tflite(tmp_path / "nope.tflite")
    content = _path("cnn").read_bytes()
    for cut in (100, len(content) // 2, len(content) - 8):
        with pytest.raises(ModelError, match=r"^the model given as bytes is a damaged TFLite model \(.*\): "
                                             r"convert it again$"):
            import_tflite(content[:cut])
    with pytest.raises(ModelError, match=r"^cannot import a int: pass a path to a \.tflite file or its bytes$"):
        import_tflite(3)
    with pytest.raises(ModelError, match=r"^shapes names 'nope', which is not an input of the model; its inputs "
                                         r"are 'image'$"):
        import_tflite(_path("cnn"), shapes={"nope": (1, 2)})


def _with_op_code(content: bytes, old: int, new: int) -> bytes:
    """The model with every operator code ``old`` replaced by ``new`` (edited in the flatbuffer)."""
    import tflite

    data = bytearray(content)
    root = tflite.Model.GetRootAsModel(content, 0)
    for i in range(root.OperatorCodesLength()):
        code = root.OperatorCodes(i)
        if max(code.BuiltinCode(), code.DeprecatedBuiltinCode()) != old:
            continue
        for slot, size in ((4, 1), (10, 4)):  # deprecated_builtin_code (int8), builtin_code (int32)
            offset = code._tab.Offset(slot)
            if offset:
                data[code._tab.Pos + offset: code._tab.Pos + offset + size] = new.to_bytes(size, "little")
    return bytes(data)


def test_an_op_tvm_cannot_convert_is_named():
    from tflite.BuiltinOperator import BuiltinOperator

    content = _with_op_code(_path("cnn").read_bytes(), BuiltinOperator.SOFTMAX, BuiltinOperator.LSH_PROJECTION)
    with pytest.raises(UnsupportedOpError, match=r"^op \d+ producing 'Identity' is a LSH_PROJECTION, which TVM's "
                                                 r"TFLite importer cannot convert: convert the model with builtin "
                                                 r"ops only \(no SELECT_TF_OPS or custom ops\)$"):
        import_tflite(content)


def test_a_failing_converter_names_the_op(monkeypatch):
    from tvm.relax.frontend.tflite.tflite_frontend import OperatorConverter

    def broken(self, op):
        raise ValueError("cannot convert\nsecond line")

    monkeypatch.setattr(OperatorConverter, "convert_softmax", broken)
    with pytest.raises(UnsupportedOpError, match=r"^TVM's TFLite importer failed on op \d+ producing 'Identity' "
                                                 r"\(SOFTMAX\): cannot convert$"):
        import_tflite(_path("cnn"))


def test_ids_outside_the_embedding_are_refused():
    probe = _probe("bert", "default")
    inputs = dict(_tf("bert")[0])
    assert probe.inputs[0].index_bound == 50
    inputs["input_ids"] = inputs["input_ids"].copy()
    inputs["input_ids"][0, 0] = 50
    with pytest.raises(InputError, match=r"^input 'input_ids' holds values outside \[0, 50\)"):
        probe.run(inputs)
    inputs["input_ids"][0, 0] = -1  # TFLite's GATHER takes no negative ids; TVM would read outside the table
    with pytest.raises(InputError, match=r"^input 'input_ids' holds values outside \[0, 50\)"):
        probe.run(inputs)


@needs_interpreter
def test_interpreter_inputs_are_checked():
    inputs = _tf("bert")[0]
    with pytest.raises(InputError, match=r"^input 'input_ids' is int64\[1, 8\], the TFLite model takes int32\[1, 8\]$"):
        tflite_values(_path("bert"), {**inputs, "input_ids": inputs["input_ids"].astype(np.int64)})
    with pytest.raises(InputError, match=r"^missing input\(s\) \['attention_mask'\]: the TFLite model takes "):
        tflite_values(_path("bert"), {"input_ids": inputs["input_ids"]})


def test_missing_packages_are_one_line_model_errors():
    no_tflite = run_python(
        "import sys; sys.modules['tflite'] = None\n"
        "from tvm_probe.importer.tflite import import_tflite\n"
        "from tvm_probe import ModelError\n"
        f"try:\n    import_tflite({str(_path('cnn'))!r})\n"
        "except ModelError as err:\n    print(err)\n")
    assert no_tflite.stdout.strip() == ("TVM's TFLite importer needs the 'tflite' package: "
                                        + install_hint("tflite")), no_tflite.stderr
    no_interpreter = run_python(
        "import sys\n"
        "for m in ('ai_edge_litert', 'ai_edge_litert.interpreter', 'tflite_runtime', "
        "'tflite_runtime.interpreter', 'tensorflow'):\n    sys.modules[m] = None\n"
        "from tvm_probe.comparison.reference.tflite import tflite_values\n"
        "from tvm_probe import ModelError\n"
        f"try:\n    tflite_values({str(_path('cnn'))!r}, {{}})\n"
        "except ModelError as err:\n    print(err)\n")
    assert no_interpreter.stdout.strip() == (
        f"no TFLite interpreter is installed: {install_hint('tflite')} "
        "(ai-edge-litert; tflite-runtime or tensorflow work too)"), no_interpreter.stderr


def test_importing_tvm_probe_does_not_import_tflite_or_an_interpreter():
    result = run_python("import sys, tvm_probe, tvm_probe.importer.tflite, tvm_probe.comparison.reference.tflite\n"
                     "print(sorted(m for m in ('tflite', 'ai_edge_litert', 'tflite_runtime', 'tensorflow', 'tvm')"
                     " if m in sys.modules))")
    assert result.stdout.strip() == "[]", result.stderr


@needs_interpreter
def test_tflite_config_with_tflite_reference_through_the_cli(tmp_path):
    inputs, _ = _tf("bert")
    np.savez(tmp_path / "inputs.npz", **inputs)
    config = tmp_path / "tflite.yaml"
    config.write_text(f"model: {{tflite: '{_path('bert')}'}}\npipeline: fused\nreference: tflite\n"
                      f"inputs:\n  input_ids: {{file: inputs.npz, key: input_ids}}\n"
                      f"  attention_mask: {{file: inputs.npz, key: attention_mask}}\n"
                      f"output: {{dump: dump}}\n")
    run = run_cli("run", str(config))
    # TVM keeps dims where FULLY_CONNECTED flattens: the interpreter comparison reports exactly those
    assert run.returncode == 1, run.stderr
    assert run.stdout.strip().splitlines()[-1].startswith("FAIL: 2 of 104 compared values out of tolerance; "
                                                          "first divergent op: ")
    assert load_dump(tmp_path / "dump").get("layer_._0/attention/self/key/BiasAdd").shape == (1, 8, 32)
    config.write_text(config.read_text().replace("reference: tflite", "reference: onnxruntime")
                      .replace("output: {dump: dump}\n", ""))
    wrong = run_cli("run", str(config))
    assert wrong.returncode == 2
    assert wrong.stderr.strip().splitlines()[-1] == (f"tvm-probe: error: {config}:3: reference: 'onnxruntime' "
                                                     "cannot run a TFLite model: use reference: tflite")


# -- signature names ---------------------------------------------------------------------------
def _signed_bert() -> bytes:
    """bert.tflite as a SavedModel conversion names it (tflite_models/signatures.py): inputs
    ``serving_default_input_ids:0`` ..., output ``StatefulPartitionedCall:0``, keys in a signature."""
    from support.tflite_models.signatures import bert_with_signature

    return bert_with_signature()


@pytest.fixture(scope="module")
def signed_bert() -> bytes:
    pytest.importorskip("ai_edge_litert.schema_py_generated", reason="the signature is written with ai-edge-litert's "
                                                                      "TFLite schema")
    return _signed_bert()


@pytest.fixture(scope="module")
def signed_probe(signed_bert) -> Probe:
    return Probe.from_tflite(signed_bert)  # names are the importer's: one pipeline is enough


@pytest.mark.slow  # compiles the BERT (shared by the signature tests)
def test_signature_keys_answer_as_names_and_feed_run(signed_probe):
    inputs, _ = _tf("bert")
    probe = signed_probe
    assert [s.name for s in probe.inputs] == ["serving_default_input_ids:0", "serving_default_attention_mask:0"]
    outputs = probe.run({"input_ids": inputs["input_ids"], "attention_mask": inputs["attention_mask"]})
    assert probe.resolve("logits") == "StatefulPartitionedCall:0"
    assert probe.resolve("input_ids") == "serving_default_input_ids:0"
    np.testing.assert_array_equal(probe.get("input_ids"), inputs["input_ids"])
    np.testing.assert_array_equal(probe.get("logits"), outputs["StatefulPartitionedCall:0"])
    # tensor names feed run() too, and give the same logits
    probe.run({"serving_default_input_ids:0": inputs["input_ids"],
               "serving_default_attention_mask:0": inputs["attention_mask"]})
    np.testing.assert_array_equal(probe.get("logits"), outputs["StatefulPartitionedCall:0"])


@pytest.mark.slow
@needs_interpreter
def test_signature_keys_equal_the_interpreters_signature_runner(signed_bert, signed_probe):
    from ai_edge_litert.interpreter import Interpreter

    inputs, _ = _tf("bert")
    interp = Interpreter(model_content=signed_bert)
    expected = interp.get_signature_runner("serving_default")(**inputs)["logits"]
    signed_probe.run(inputs)
    np.testing.assert_allclose(signed_probe.get("logits"), expected, atol=ATOL)
    # our interpreter reference takes signature keys as well, and keys values by tensor name
    reference = tflite_values(signed_bert, inputs, ["StatefulPartitionedCall:0"])
    np.testing.assert_allclose(reference["StatefulPartitionedCall:0"], expected, atol=ATOL)


@pytest.mark.slow  # compiles the BERT (shared by the signature tests)
def test_an_input_given_by_key_and_by_name_is_refused(signed_probe):
    inputs, _ = _tf("bert")
    with pytest.raises(InputError, match="input 'serving_default_input_ids:0' is given twice"):
        signed_probe.run({**inputs, "serving_default_input_ids:0": inputs["input_ids"]})
