"""One adapter per model kind (tvm_probe/importer/kinds.py): found by kind, by object and by a dump's record."""
from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest
from support.processes import run_python

import tvm_probe.importer
from tvm_probe import ProbeError, demo
from tvm_probe.core.schema import ModelKind
from tvm_probe.importer.adapter import ModelAdapter
from tvm_probe.importer.kinds import KINDS, adapter_for, adapter_of, adapters, recorded


def _adapter_classes() -> list[type]:
    for info in pkgutil.iter_modules(tvm_probe.importer.__path__):
        importlib.import_module(f"tvm_probe.importer.{info.name}")
    found, todo = [], list(ModelAdapter.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in found if c.__module__.startswith("tvm_probe.importer.")]


def test_every_model_kind_has_exactly_one_adapter_living_with_its_importer():
    by_kind: dict[str, list[type]] = {}
    for cls in _adapter_classes():
        by_kind.setdefault(cls.kind, []).append(cls)
    assert sorted(by_kind) == sorted(KINDS) and len(set(KINDS)) == len(KINDS)
    assert all(len(classes) == 1 for classes in by_kind.values()), by_kind
    assert {str(k) for k in ModelKind} <= set(KINDS)  # a config's kinds all have one
    for kind in KINDS:
        adapter = adapter_for(kind)
        assert adapter.kind == kind and type(adapter) is by_kind[kind][0] and adapter.described
        assert (adapter.import_functions if adapter.functions else adapter.import_model).__qualname__ \
            .startswith(type(adapter).__name__)  # each kind implements the import it declares
    assert [a.kind for a in adapters()] == list(KINDS)
    assert adapter_for(ModelKind.TFLITE) is adapter_for("tflite")
    assert by_kind["hf"][0].__module__ == "tvm_probe.importer.hf"


def test_an_unknown_kind_is_a_one_line_error_naming_the_kinds():
    with pytest.raises(ProbeError) as caught:
        adapter_for("nope")
    message = str(caught.value)
    assert "\n" not in message and "'nope'" in message and all(kind in message for kind in KINDS), message


def test_the_adapter_of_a_model_object(tmp_path):
    import onnx

    model = demo.tiny_bert()
    plain = onnx.ModelProto()
    plain.CopyFrom(model)
    del plain.metadata_props[:]
    assert adapter_of(model).kind == "demo" and adapter_of(plain).kind == "onnx"
    assert adapter_of(str(tmp_path / "m.onnx")).kind == "onnx" and adapter_of(tmp_path / "m.tflite").kind == "tflite"
    assert adapter_of(b"....TFL3").kind == "tflite"
    with pytest.raises(ProbeError, match=r"^no model kind takes a dict: the kinds are relax, nn, hf, torch"):
        adapter_of({})


def test_relax_nn_and_torch_objects_find_their_adapters():
    import tvm
    from tvm.relax.frontend import nn

    assert adapter_of(tvm.IRModule()).kind == "relax" and adapter_of(nn.Linear(2, 2)).kind == "nn"
    torch = pytest.importorskip("torch")
    assert adapter_of((torch.nn.Linear(2, 2), (torch.randn(1, 2),))).kind == "torch"


def test_records_of_dumps_give_the_model_back(tmp_path):
    path = tmp_path / "m.onnx"
    record = adapter_for("onnx").record(path, {"x": (1, 2)})
    assert record == {"onnx": str(path.resolve()), "shapes": {"x": [1, 2]}}
    adapter, source, shapes = recorded(record)
    assert adapter.kind == "onnx" and source == path.resolve() and shapes == {"x": (1, 2)}
    assert recorded({"torch": "f.py:make"})[:2] == (adapter_for("torch"), "f.py:make")
    assert recorded(adapter_for("demo").record({"hidden": 32}))[1] == {"hidden": 32}
    with pytest.raises(ProbeError, match=r"^this dump does not record its model: give it with --model PATH$"):
        recorded({})
    with pytest.raises(ProbeError, match=r"^this dump records a model tvm_probe cannot rebuild here \(hf\)"):
        recorded({"hf": "f.py:make"})
    with pytest.raises(ProbeError, match=r"cannot be recorded"):
        adapter_for("relax").record(None)


def test_the_demo_adapter_loads_imports_and_gives_its_inputs():
    adapter = adapter_for("demo")
    model = adapter.load({"preset": "tiny", "hidden": 32})
    imported = adapter.import_model(model)
    inputs = adapter.default_inputs(model, imported.inputs)
    assert set(inputs) == {s.name for s in imported.inputs}
    np.testing.assert_array_equal(inputs["input_ids"], demo.demo_inputs(model)["input_ids"])
    assert adapter.source_graph({}).format == "onnx" and adapter.graph == "onnx"
    assert adapter_for("onnx").default_inputs(model, imported.inputs) is None
    assert tvm_probe.importer.import_model("demo", model).model_hash == imported.model_hash
    with pytest.raises(ProbeError, match=r"^a Relax IRModule has no source graph Model Explorer can show"):
        adapter_for("relax").source_graph(None)


def test_importing_the_importer_imports_no_optional_dependency():
    heavy = ("torch", "tflite", "transformers", "tvm", "onnx")
    result = run_python("import sys, tvm_probe.importer, tvm_probe.importer.kinds\n"
                        f"print(sorted(m for m in {heavy!r} if m in sys.modules))")
    assert result.stdout.strip() == "[]", result.stderr
