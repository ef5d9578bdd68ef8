"""YAML configs: the whole file is validated first; every problem names its line and key."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from tvm_probe.app.config import ConfigError, load_config


def write(tmp_path, text, name="c.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_shipped_configs_are_valid():
    from pathlib import Path

    root = Path(__file__).parents[2] / "configs"
    for name in ("demo.yaml", "bert-base.yaml", "example.yaml"):
        cfg = load_config(root / name)
        assert cfg.model.kind == "demo" and cfg.reference.runtime == "onnxruntime"
    torch_cfg = load_config(root / "torch-bert.yaml")
    assert torch_cfg.model.kind == "torch" and torch_cfg.model.source.endswith("tests/support/torch_models.py:tiny_torch_bert")
    assert torch_cfg.reference.runtime == "torch"
    assert load_config(root / "split-demo.yaml").split.cuts == ("layer_._3/output/LayerNorm",)
    example = load_config(root / "example.yaml")
    assert [i.name for i in example.inputs] == ["input_ids", "attention_mask"]
    assert example.reference.tolerance_for(["a/b/Softmax"]).atol == 1e-5
    assert example.reference.tolerance_for(["a/b/MatMul"]) is None  # no pattern: the general rule
    assert (example.reference.atol, example.reference.rtol) == (1e-4, 1e-3)
    assert load_config(root / "demo.yaml").reference.atol is None  # by dtype


def test_every_problem_is_reported_with_its_line(tmp_path):
    path = write(tmp_path, "model:\n  onnx: missing.onnx\n"
                           "pipeline: turbo\n"
                           "colour: blue\n"
                           "reference:\n  runtime: onnxruntime\n  atol: -1\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == (
        f"{path} has 4 problems: "
        f"line 2: model.onnx: file '{tmp_path / 'missing.onnx'}' does not exist; "
        "line 3: pipeline: must be one of default, fused, default_build, zero, static_shape_tuning, got 'turbo'; "
        "line 4: colour: unknown key; valid keys here: model, inputs, target, pipeline, capture, reference, output, "
        "split, verify, import_fixes, remote, precision, generate, quantization; "
        "line 7: reference.atol: must be a number >= 0, got -1")


@pytest.mark.parametrize("text, message", [
    ("", "the config is empty: it needs at least a 'model' key"),
    ("- a\n- b\n", ":1: the config must be a mapping of keys (model, inputs, ...), not a list"),
    ("model: [1, 2\n", ": not valid YAML"),
    ("target: llvm\n", ":1: model: missing: give {onnx: PATH}, {tflite: PATH} or {demo: {...}}"),
    ("model:\n  demo: {layers: 2}\n", ":2: model.demo.layers: unknown key; valid keys here: preset, num_layers"),
    ("model:\n  demo: {}\ncapture: 3\n", ":3: capture: must be 'all' or a list of names/patterns, got 3"),
    ("model:\n  demo: {}\ninputs:\n  x: {random: {dtype: complex}}\n",
     ":4: inputs.x.random.dtype: must be one of float16"),
    ("model:\n  demo: {}\noutput:\n  write: [pdf]\n", ":4: output.write: must be a list of csv, html, graph"),
    ("model:\n  demo: {num_layers: two}\n", ":2: model.demo.num_layers: must be a non-negative integer, got 'two'"),
])
def test_single_problems(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(str(path)) and message in str(err.value)


def test_overrides_use_the_same_schema(tmp_path):
    path = write(tmp_path, "model:\n  demo: {}\n")
    cfg = load_config(path, ["pipeline=fused", "output.dump=out", "reference.atol=0.5"])
    assert cfg.pipeline == "fused" and cfg.output.dump == tmp_path / "out"
    assert cfg.reference.atol == 0.5 and cfg.reference.runtime == "onnxruntime"
    with pytest.raises(ConfigError) as err:
        load_config(path, ["pipeline=x"])
    # the problem is where the value came from: the --set, not a line of the file
    assert str(err.value) == "--set pipeline=x: pipeline: must be one of default, fused, default_build, zero, static_shape_tuning, got 'x'"
    with pytest.raises(ConfigError, match="is not KEY=VALUE"):
        load_config(path, ["pipeline"])


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist: check the path"):
        load_config(tmp_path / "nope.yaml")


def test_the_split_demo_override_its_comment_suggests_is_valid():
    from pathlib import Path

    config = Path(__file__).parents[2] / "configs" / "split-demo.yaml"
    suggested = next(line for line in config.read_text().splitlines() if "--set" in line)
    item = shlex.split(suggested.split("--set", 1)[1])[0]  # as a shell would pass it
    assert load_config(config, [item]).split.balance == 1


def test_a_reference_that_cannot_run_the_model_is_refused_before_compiling(tmp_path):
    path = write(tmp_path, "model:\n  torch: tests.torch_models:tiny_torch_bert\nreference: onnxruntime\n")
    with pytest.raises(ConfigError, match=":3: reference: 'onnxruntime' cannot run a PyTorch model: "
                                          "use reference: torch$"):
        load_config(path)


def test_output_weights_and_verify_keys(tmp_path):
    path = write(tmp_path, "model:\n  demo: {}\noutput: {dump: d, weights: true}\nverify: true\n")
    cfg = load_config(path)
    assert cfg.output.weights is True and cfg.verify is True
    with pytest.raises(ConfigError, match="output.weights: must be true or false, got 'yes please'"):
        load_config(path, ["output.weights=yes please"])


def test_reference_tvm_none_and_a_tvm_build_with_its_spec(tmp_path):
    from tvm_probe.app.investigate import chosen_reference
    from tvm_probe.probe.tvm_reference import TVMBuildReference

    def reference(text):
        return load_config(write(tmp_path, f"model:\n  demo: {{}}\nreference: {text}\n")).reference

    plain = reference("tvm")
    assert (plain.runtime, plain.build) == ("tvm", {"pipeline": "default", "target": "llvm"})
    assert chosen_reference(plain) == TVMBuildReference("llvm", "default")
    fused = reference("{tvm: {pipeline: fused}, atol: 0.1}")
    assert fused.runtime == "tvm" and fused.atol == 0.1
    assert chosen_reference(fused) == TVMBuildReference("llvm", "fused")
    nothing = reference("none")
    assert nothing.runtime == "none" and nothing.build is None and chosen_reference(nothing) is None
    assert chosen_reference(reference("onnxruntime")).name == "onnxruntime"
    with pytest.raises(ConfigError, match=r"reference.tvm.pipeline: must be one of default, fused, default_build, zero, static_shape_tuning, got 'fast'"):
        reference("{tvm: {pipeline: fast}}")


def test_the_default_reference_is_the_one_the_model_kind_names(tmp_path):
    """No ``reference:``: the model's kind picks it (its adapter's), as ``compare DUMP`` does."""
    factory = Path(__file__).parents[1] / "support" / "torch_models.py"
    cases = {"model: {demo: {}}\n": "onnxruntime", f"model: {{torch: '{factory}:tiny_torch_bert'}}\n": "torch"}
    for text, runtime in cases.items():
        path = tmp_path / "c.yaml"
        path.write_text(text)
        assert load_config(path).reference.runtime == runtime


def test_a_key_a_set_made_is_blamed_on_the_set(tmp_path):
    """``--set foo.bar=1`` makes ``foo``: the problem is the --set's, not a line of the file."""
    path = tmp_path / "c.yaml"
    path.write_text("model: {demo: {}}\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, ["foo.bar=1"])
    assert str(err.value).startswith("--set foo.bar=1: foo: unknown key; valid keys here: model,")
