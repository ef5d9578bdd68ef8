"""``tvm-probe run MODEL_FILE``: no config, dynamic dimensions that just run, errors in the user's terms.

Issue 54: a tf2onnx export's unnamed batch dimension (``unk__214``) and the dynamo exporter's
dynamic axes run without a ``shapes:`` entry; the run says which sizes it chose, with the flag or
config key that changes them; ``--write-config`` writes the YAML the run stands for, which runs.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import yaml
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from tvm_probe import Probe, demo, load_dump, onnxruntime_values

ROOT = Path(__file__).parents[2]


def tf2onnx_like(path):
    """What tf2onnx writes for a Keras model with an unknown batch: input ``bytes [unk__214, 16]``
    of token ids, an embedding Gather, and a Reshape whose target is computed from ``Shape`` —
    the chain TVM's importer cannot follow symbolically ("Reshape requires the input new shape
    to be Shape")."""
    rng = np.random.default_rng(0)
    table = nh.from_array(rng.standard_normal((257, 4)).astype(np.float32), "embedding")
    tail = nh.from_array(np.array([64], np.int64), "flat")
    nodes = [
        h.make_node("Gather", ["embedding", "bytes"], ["embedded"], name="model/embedding/Gather"),
        h.make_node("Shape", ["bytes"], ["shape"], name="model/Shape"),  # tf.shape is int32: casts around it
        h.make_node("Cast", ["shape"], ["shape_i32"], name="model/Shape__1", to=T.INT32),
        h.make_node("Slice", ["shape_i32", "zero", "one"], ["batch_i32"], name="model/strided_slice"),
        h.make_node("Cast", ["batch_i32"], ["batch"], name="model/strided_slice__2", to=T.INT64),
        h.make_node("Concat", ["batch", "flat"], ["target"], axis=0, name="model/concat"),
        h.make_node("Reshape", ["embedded", "target"], ["flattened"], name="model/Reshape"),
        h.make_node("Relu", ["flattened"], ["scores"], name="model/Relu"),
    ]
    graph = h.make_graph(nodes, "tf2onnx", [h.make_tensor_value_info("bytes", T.INT32, ["unk__214", 16])],
                         [h.make_tensor_value_info("scores", T.FLOAT, ["unk__215", 64])],
                         [table, tail, nh.from_array(np.array([0], np.int64), "zero"),
                          nh.from_array(np.array([1], np.int64), "one")])
    onnx.save(h.make_model(graph, opset_imports=[h.make_opsetid("", 13)]), path)
    return path


def tvm_probe(*args, cwd) -> subprocess.CompletedProcess:
    """``tvm-probe ARGS`` in a fresh process started in ``cwd`` (where ./tvm_probe_out goes), with
    this checkout's tvm_probe."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "tvm_probe.app.cli", "-q", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True)


def test_a_tf2onnx_model_with_an_unnamed_batch_runs_and_says_the_size_it_chose(tmp_path):
    model = tf2onnx_like(tmp_path / "classifier.onnx")
    done = tvm_probe("run", model, "--write-config", "classifier.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip() == ("tvm-probe: bytes: dimension 0 (unk__214) set to 1; to choose, give --shapes "
                                   "bytes=1x16 or set model.shapes.bytes: [1, 16] in a config")
    out = tmp_path / "tvm_probe_out" / "classifier"
    assert f"dump: {out / 'dump'}" in done.stdout and f"html: {out / 'report' / 'report.html'}" in done.stdout
    assert re.search(r"^all \d+ compared values within tolerance", done.stdout, re.M)  # onnxruntime: the default
    config = yaml.safe_load((tmp_path / "classifier.yaml").read_text())
    assert config["model"] == {"onnx": "classifier.onnx"} and config["inputs"] == "random"
    # the written config runs as it stands, from another folder, and replaces the output of the first run
    again = tvm_probe("run", tmp_path / "classifier.yaml", "--shapes", "bytes=3x16", cwd=tmp_path.parent)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert re.search(r"^all \d+ compared values within tolerance", again.stdout, re.M)
    ids = load_dump(out / "dump").get("bytes")
    assert ids.shape == (3, 16) and 0 <= ids.min() and ids.max() < 257  # drawn within the embedding's rows
    assert ids.max() > 1  # (not the [0, 2) of other int inputs)


def test_python_takes_the_same_model_without_shapes_and_compares_after_a_run(tmp_path):
    model = tf2onnx_like(tmp_path / "classifier.onnx")
    probe = Probe.from_onnx(model)
    ids = np.arange(16, dtype=np.int32).reshape(1, 16)
    probe.run({"bytes": ids})
    comparison = probe.compare(onnxruntime_values(model, {"bytes": ids}))
    assert comparison and comparison.verdict().startswith("all 8 compared values within tolerance")


def test_a_dynamo_export_with_a_dynamic_batch_runs_without_shapes(tmp_path):
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from support.hf_models import export_dynamo
    from support.torch_models import tiny_torch_cnn

    module, args = tiny_torch_cnn(batch=2)
    with torch.no_grad():
        model = export_dynamo(module, args, tmp_path / "cnn.onnx", ["image"], {"image": {0: "batch"}})
    assert onnx.load(model).graph.input[0].type.tensor_type.shape.dim[0].dim_param  # a named dynamic axis
    done = tvm_probe("run", model, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "compared values within tolerance" in done.stdout
    # built symbolic (TVM follows the batch), so the random input takes a size, and says which
    assert done.stderr.startswith("tvm-probe: image: dimension 0 (batch) set to 1; to choose, give --shapes "
                                  "image=1x3x16x16"), done.stderr


def test_shape_and_dtype_errors_name_the_flag_or_the_yaml_key_and_line(tmp_path):
    model = tf2onnx_like(tmp_path / "classifier.onnx")
    wrong = tvm_probe("run", model, "--shapes", "bytes=2x15", cwd=tmp_path)
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == ("tvm-probe: error: the shape given for input 'bytes', [2, 15], sets dim 1 to 15; "
                                    "the model declares bytes [unk__214, 16]: give --shapes bytes=2x16 or set "
                                    "model.shapes.bytes: [2, 16] in a config")
    np.savez(tmp_path / "floats.npz", bytes=np.zeros((1, 16), np.float32))
    floats = tvm_probe("run", model, "--inputs", "floats.npz", cwd=tmp_path)
    assert floats.returncode == 2
    assert floats.stderr.strip().endswith("input 'bytes' has dtype float32, the model expects int32: give --inputs "
                                          "FILE.npz holding bytes as int32 or set inputs.bytes: a file of int32 "
                                          "values, or {random: {dtype: int32}} in a config")
    (tmp_path / "run.yaml").write_text("model: {onnx: classifier.onnx}\n\ninputs:\n  bytes: {random: {dtype: int64}}\n")
    in_config = tvm_probe("run", tmp_path / "run.yaml", cwd=tmp_path)
    assert in_config.returncode == 2
    assert in_config.stderr.strip().endswith(f"set inputs.bytes: a file of int32 values, or {{random: {{dtype: "
                                             f"int32}}}} in {tmp_path / 'run.yaml'}:4")
    assert "astype" not in floats.stderr + in_config.stderr + wrong.stderr  # Python's words stay in Python


def test_the_demo_prints_no_raw_tvm_warning_and_titles_its_table(tmp_path):
    onnx.save(demo.tiny_bert(), tmp_path / "bert.onnx")
    done = tvm_probe("run", "bert.onnx", cwd=tmp_path)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "TVM printed 1 warning while compiling: see Build notes in " in done.stdout
    assert "Fast mode segfaults" not in done.stdout
    assert "largest 5 errors of " in done.stdout


def test_a_saved_torch_program_runs_with_its_example_inputs_and_module_paths(tmp_path):
    torch = pytest.importorskip("torch")
    from support.torch_models import tiny_torch_cnn

    module, args = tiny_torch_cnn(batch=1)
    torch.export.save(torch.export.export(module, args), tmp_path / "cnn.pt2")
    done = tvm_probe("run", "cnn.pt2", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^all \d+ compared values within tolerance", done.stdout, re.M)  # against eager PyTorch
    dump = load_dump(tmp_path / "tvm_probe_out" / "cnn" / "dump")
    np.testing.assert_array_equal(*dump.inputs.values(), args[0].numpy())  # the program's own example input
    with torch.no_grad():
        expected = module.conv1(args[0]).numpy()
    np.testing.assert_allclose(dump.get("conv1"), expected, atol=1e-5)  # by the module path the user has
