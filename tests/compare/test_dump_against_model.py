"""A dump compared with the model it records (``tvm-probe compare DUMP``): the model is found
again, imported and run by its reference through its kind's adapter, for every kind a config names."""
from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from support.models import small_cnn

from tvm_probe import load_dump
from tvm_probe.app.config import load_config
from tvm_probe.app.investigate import investigate
from tvm_probe.comparison.dump import compare_dump, recorded_model
from tvm_probe.core.errors import ProbeError
from tvm_probe.importer.kinds import adapter_for

SUPPORT = Path(__file__).parents[1] / "support"


def _onnx_file(folder: Path) -> str:
    onnx.save(small_cnn(channels=4, image=8), str(folder / "cnn.onnx"))
    return "model: {onnx: cnn.onnx}\ninputs: {image: {random: {seed: 1}}}\n"


MODELS = {
    "demo": lambda folder: "model: {demo: {num_layers: 1}}\n",
    "onnx": _onnx_file,
    "torch": lambda folder: f"model: {{torch: '{SUPPORT / 'torch_models.py'}:tiny_torch_cnn'}}\n",
}


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_a_dump_of_each_kind_is_compared_with_the_model_it_records(kind, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(MODELS[kind](tmp_path) + "reference: none\noutput: {dump: dump}\n")
    cfg = load_config(config)
    assert cfg.model.kind == kind
    outcome = investigate(cfg)
    reader = load_dump(outcome.dump)

    adapter, source, shapes = recorded_model(reader)
    assert adapter is adapter_for(kind) and adapter.record(source, shapes) == reader.metadata["model"]
    comparison = compare_dump(reader)
    assert comparison, comparison.verdict()
    outputs = {v.key for v in comparison.values if v.passed} & set(reader.sources_map.model_outputs)
    assert outputs and len([v for v in comparison.values if v.passed]) > len(outputs)  # intermediates too


def test_a_dump_is_refused_when_its_model_changed(tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text(_onnx_file(tmp_path) + "reference: none\noutput: {dump: dump}\n")
    reader = load_dump(investigate(load_config(config)).dump)
    onnx.save(small_cnn(channels=4, image=8, seed=3), str(tmp_path / "other.onnx"))
    with pytest.raises(ProbeError, match=r"^the model differs from the one the dump was made with \(hash mismatch\)"):
        compare_dump(reader, model_path=tmp_path / "other.onnx")
    assert compare_dump(reader, model_path=tmp_path / "cnn.onnx")  # --model PATH: an ONNX file
