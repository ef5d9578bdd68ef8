"""reduce: real TVM 0.27 bugs (tests/support/tvm_bugs.py), embedded in bigger models, cut down to the
nodes they need; reproduction folders that show them in a fresh Python process."""
from __future__ import annotations

import ast
import functools
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from support.tvm_bugs import BUGS
from tvm_probe import InputError
from tvm_probe.tools.reduce import FILES, Checker, CompileFailure, ReduceError, Search, SubModels, TVMBuild, reduce
from tvm_probe.tools.reduce.check import onnxruntime_reference as _onnxruntime
from tvm_probe.tools.reduce.search import run_search as _search
from tvm_probe.comparison.reference.onnxruntime import onnxruntime_values
from tvm_probe.core.tolerance import describe_defaults

FAST_MATH = {"kind": "llvm", "fast-math": True}
SLOW_BUGS = [name for name in sorted(BUGS) if name != "relu_nan"]  # relu_nan's folder is checked unmarked


# ------------------------------------------------------------------ the search, without TVM
def test_search_bisects_a_window_then_drops_single_nodes():
    search = Search(20, lambda keep: {3, 7} <= keep)
    assert search.run() == [3, 7]
    assert len(search.tried) < 20  # whole, ~2 log2(20) bisection steps, one try per node of the window


def test_search_tries_the_failing_node_alone_first():
    steps = []
    search = Search(9, lambda keep: 4 in keep, pinned=4, progress=steps.append)
    assert search.run() == [4]
    assert [(s.phase, s.nodes, s.reproduced, s.best) for s in steps] == [("check", 9, True, 9),
                                                                          ("isolate", 1, True, 1)]


def test_search_keeps_the_pinned_node_and_what_it_needs():
    search = Search(8, lambda keep: {2, 5} <= keep, pinned=5)
    assert search.run() == [2, 5]
    assert all(5 in keep for keep in search.tried if keep)


def test_search_gives_up_when_the_whole_does_not_reproduce():
    assert Search(5, lambda keep: False).run() is None


def test_search_out_of_time_returns_what_it_verified():
    search = Search(6, lambda keep: 2 in keep, max_seconds=0)
    assert search.run() == [0, 1, 2, 3, 4, 5] and search.stopped
    assert list(search.tried) == [frozenset(range(6))]


# ------------------------------------------------------------------ real bugs, real TVM
def _node_names(model) -> list[str]:
    return [n.name for n in model.graph.node]


@functools.lru_cache(maxsize=None)
def _reduced(name: str):
    """``reduce`` of bug ``name`` with the defaults (shared: do not modify the result)."""
    model, inputs = BUGS[name].build()
    return model, reduce(model, inputs)


@pytest.mark.parametrize("name", sorted(BUGS))
def test_reduce_leaves_only_the_nodes_the_bug_needs(name):
    bug = BUGS[name]
    model, result = _reduced(name)
    assert _node_names(result.model) == list(bug.nodes), result.summary()
    assert result.nodes_before == len(model.graph.node) > result.nodes_after == len(bug.nodes)
    assert result.failure.kind == bug.kind
    if bug.kind == "divergence":  # the first divergent value of the whole model is the bug's output
        assert (result.failure.node, result.failure.op_type) == (bug.nodes[-1], bug.op)
        assert result.failure.tensor in result.expected and result.failure.tensor in result.actual
    else:
        ops = " + ".join(n.op_type for n in result.model.graph.node)
        assert result.headline().startswith(f"{ops} fails to ") and bug.op in ops
    assert result.seconds > 0 and result.tried >= 2
    assert result.summary().startswith(f"reduced {result.nodes_before} nodes to {result.nodes_after} (")


def test_sub_model_inputs_are_what_onnxruntime_computed_on_the_whole_model():
    model, result = _reduced("relu_nan")
    whole = onnxruntime_values(model, BUGS["relu_nan"].build()[1])
    assert list(result.inputs) == ["pre/sqrt:0"]
    np.testing.assert_array_equal(result.inputs["pre/sqrt:0"], whole["pre/sqrt:0"])  # NaN included
    assert np.isnan(result.expected["bug/relu:0"]).sum() == 4 and not np.isnan(result.actual["bug/relu:0"]).any()
    assert result.statement() == (
        f"TVM {result.tvm_version} (llvm, pipeline default) computes Relu 'bug/relu' (output 'bug/relu:0') unlike "
        "onnxruntime: 4 of 12 elements are NaN in onnxruntime and numbers in TVM")


def test_a_failure_needing_two_nodes_keeps_both():
    """MaxPool alone diverges (a different failure); Reshape alone, fed onnxruntime's 3x3, builds."""
    _, result = _reduced("maxpool_same_lower_then_reshape")
    assert _node_names(result.model) == ["bug/maxpool", "bug/flatten"]
    assert isinstance(result.failure, CompileFailure) and result.failure.stage == "import"
    assert result.failure.error_type == "ValueError"
    assert result.headline() == "MaxPool + Reshape fails to import (ValueError)"
    assert list(result.inputs) == ["pre/bias:0"] and result.actual is None


def test_two_tvm_builds_diverge_fast_math_drops_isnan():
    """The reference can be another TVM build: LLVM's fast-math assumes no NaN, so IsNaN is false."""
    model, inputs = _isnan_model()
    result = reduce(model, inputs, target=FAST_MATH, reference=TVMBuild("llvm"))
    assert _node_names(result.model) == ["bug/isnan"]
    assert result.reference_label == "TVM (llvm, pipeline default)"
    assert result.failure.counts == (("value", 4),) and result.expected_from == result.reference_label
    assert "4 of 8 elements differ (compared exactly)" in result.statement()


def test_a_time_limit_returns_the_smallest_model_verified_so_far():
    model, inputs = BUGS["slice_empty_negative_step"].build()
    result = reduce(model, inputs, max_seconds=0)
    assert not result.complete and result.nodes_after == result.nodes_before == len(model.graph.node)
    assert "sub-models tried (stopped at the time limit: it may reduce further): " in result.summary()


# ------------------------------------------------------------------ refusals, one line each
def test_nothing_to_reduce_when_tvm_agrees():
    model, inputs = BUGS["relu_nan"].build()
    with pytest.raises(ReduceError) as err:
        reduce(model, {"x": np.abs(inputs["x"]) + 0.5})  # sqrt(2x - 1) has no NaN: Relu is right
    assert str(err.value) == ("nothing to reduce: TVM (llvm, pipeline default) builds the model and agrees with "
                              f"onnxruntime on every value within tolerance ({describe_defaults()}; "
                              "differences within 8 ulps count as rounding: --exact counts them)")


def test_nothing_to_reduce_between_equal_builds():
    model, inputs = _isnan_model()
    with pytest.raises(ReduceError, match=r"^nothing to reduce: TVM \(llvm, pipeline default\) builds the model "
                                          r"and agrees with TVM \(llvm, pipeline fused\) on every value"):
        reduce(model, inputs, reference={"tvm": {"target": "llvm", "pipeline": "fused"}})


def test_a_failure_that_never_reproduces_is_refused():
    """The whole model, rebuilt as a sub-model, must fail as it did; here it builds fine."""
    model, inputs = BUGS["relu_nan"].build()
    graph = SubModels(model, {**inputs, **onnxruntime_values(model, inputs)})
    made_up = CompileFailure("compile", "InternalError", "Check failed: made up")
    with pytest.raises(ReduceError) as err:
        _search(graph, Checker("llvm", "default", _onnxruntime(), None), made_up, None)
    assert str(err.value) == ("the failure does not reproduce on any sub-model, not even the whole model with "
                              "static input shapes: TVM: tvm.compile fails with InternalError: Check failed: made up")


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(inputs={}), InputError, "input 'x' is missing: the model takes x"),
    (dict(inputs={"x": 0, "y": 1}), InputError, "the model has no input 'y': it takes x"),
    (dict(reference="torch"), ReduceError,
     "reference 'torch' cannot run ONNX models, which reduce carves: use onnxruntime or a TVM build"),
    (dict(reference=3), ReduceError, "reference must be None, a reference name ('onnxruntime'), a TVMBuild or "
                                     "{'tvm': {'target': ..., 'pipeline': ...}}, got 3"),
    (dict(reference={"tvm": {"pipline": "fused"}}), ReduceError,
     "reference {'tvm': {'pipline': 'fused'}} is not a build: give {'tvm': {'target': ..., 'pipeline': ...}}"),
])
def test_bad_arguments_are_one_line_errors(kwargs, error, message):
    model, inputs = BUGS["relu_nan"].build()
    kwargs = {"inputs": inputs, **kwargs}
    with pytest.raises(error) as err:
        reduce(model, **kwargs)
    assert str(err.value) == message


def test_a_custom_pipeline_reduces_but_cannot_be_written_standalone(tmp_path):
    from tvm import relax

    model, inputs = BUGS["relu_nan"].build()
    result = reduce(model, inputs, pipeline=relax.get_pipeline("default"))
    assert _node_names(result.model) == ["bug/relu"]
    with pytest.raises(ReduceError) as err:
        result.write(tmp_path / "repro")
    assert str(err.value) == ("repro.py needs a named pipeline (one of default, fused, default_build, zero, static_shape_tuning), not the custom pass "
                              "'_pipeline': a standalone script cannot rebuild it")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ the reproduction folder
def _run_repro(folder, cwd) -> subprocess.CompletedProcess:
    """repro.py in a fresh, isolated interpreter (-I: no PYTHONPATH, no user site, not its own dir)."""
    return subprocess.run([sys.executable, "-I", str(folder / "repro.py")], cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def _check_folder(result, folder, tmp_path):
    assert sorted(p.name for p in folder.iterdir()) == sorted(FILES)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a temporary folder was left behind"
    script = (folder / "repro.py").read_text()
    assert _imported_packages(script) == {"sys", "pathlib", "numpy", "onnx", "onnxruntime", "tvm"}
    with np.load(folder / "inputs.npz") as f:
        assert set(f.files) == set(result.inputs)
        for name in f.files:
            np.testing.assert_array_equal(f[name], result.inputs[name])
    reduced = onnx.load(str(folder / "model.onnx"))
    assert _node_names(reduced) == _node_names(result.model)
    readme = (folder / "README.md").read_text()
    for fact in (f"| TVM | {result.tvm_version} |", "| target | `llvm` |", result.statement(), "python repro.py",
                 "REPRODUCED"):
        assert fact in readme
    done = _run_repro(folder, cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "REPRODUCED" in done.stdout
    if result.failure.kind == "divergence":
        assert f"MISMATCH output '{result.failure.tensor}'" in done.stdout
    else:
        assert f"{result.failure.error_type}: {result.failure.short_message}" in done.stdout
    return done


def test_repro_folder_reproduces_in_a_fresh_process(tmp_path):
    model, inputs = BUGS["relu_nan"].build()
    result = reduce(model, inputs, out_dir=tmp_path / "repro")
    assert result.out_dir == tmp_path / "repro"
    _check_folder(result, tmp_path / "repro", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW_BUGS)
def test_every_bug_reproduces_from_its_folder(name, tmp_path):
    model, inputs = BUGS[name].build()
    result = reduce(model, inputs, out_dir=tmp_path / "repro")
    _check_folder(result, tmp_path / "repro", tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["relu_nan", "resize_half_pixel", "maxpool_same_lower_then_reshape"])
def test_fused_pipeline_reduces_the_same_way(name, tmp_path):
    bug = BUGS[name]
    model, inputs = bug.build()
    result = reduce(model, inputs, pipeline="fused", out_dir=tmp_path / "repro")
    assert _node_names(result.model) == list(bug.nodes)
    assert "PIPELINE = 'fused'" in (tmp_path / "repro" / "repro.py").read_text()
    _check_folder(result, tmp_path / "repro", tmp_path)


@pytest.mark.slow
def test_two_build_repro_compares_the_builds(tmp_path):
    model, inputs = _isnan_model()
    reduce(model, inputs, target=FAST_MATH, reference={"tvm": {"target": "llvm"}}, out_dir=tmp_path / "repro")
    script = (tmp_path / "repro" / "repro.py").read_text()
    assert "TARGET = {'kind': 'llvm', 'fast-math': True}" in script and "REFERENCE = ('llvm', 'default')" in script
    done = _run_repro(tmp_path / "repro", cwd=tmp_path)
    assert done.returncode == 1 and "MISMATCH output 'bug/isnan:0'" in done.stdout


def test_an_existing_folder_is_kept_unless_overwrite(tmp_path):
    _, result = _reduced("slice_empty_negative_step")
    out = tmp_path / "repro"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    message = f"'{out}' already exists: choose another folder or pass overwrite=True"
    with pytest.raises(ReduceError) as err:
        result.write(out)
    assert str(err.value) == message
    with pytest.raises(ReduceError) as err:  # refused before any work
        reduce(*BUGS["slice_empty_negative_step"].build(), out_dir=out)
    assert str(err.value) == message
    assert (out / "mine.txt").read_text() == "keep me"
    result.write(out, overwrite=True, verify=False)
    assert sorted(p.name for p in out.iterdir()) == sorted(f for f in FILES)
    assert [p.name for p in tmp_path.iterdir()] == ["repro"]


@pytest.mark.slow
def test_a_folder_that_does_not_reproduce_is_never_written(tmp_path):
    """Verification runs repro.py before the rename: a model that does not fail leaves nothing."""
    model, inputs = BUGS["relu_nan"].build()
    result = reduce(model, inputs)
    result.inputs = {"pre/sqrt:0": np.nan_to_num(result.inputs["pre/sqrt:0"], nan=1.0)}  # Relu is right
    result.expected = {"bug/relu:0": result.inputs["pre/sqrt:0"]}
    with pytest.raises(ReduceError) as err:
        result.write(tmp_path / "repro")
    assert str(err.value) == (
        "the reduced model does not reproduce the failure in a plain TVM run (repro.py exit status 0: "
        "NOT REPRODUCED: TVM agrees with onnxruntime); nothing was written. Please report this")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ helpers
def _imported_packages(script: str) -> set[str]:
    """Top-level packages a script imports."""
    roots = set()
    for node in ast.walk(ast.parse(script)):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            roots.add(node.module.split(".")[0])
    return roots


def _isnan_model():
    """``isnan(sqrt(2x - 1))`` between unrelated ops; NaN at the 4 smallest of 8 values of x."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Mul", ["x", "two"], ["pre/scale:0"], name="pre/scale"),
             helper.make_node("Sub", ["pre/scale:0", "one"], ["pre/shift:0"], name="pre/shift"),
             helper.make_node("Sqrt", ["pre/shift:0"], ["pre/sqrt:0"], name="pre/sqrt"),
             helper.make_node("IsNaN", ["pre/sqrt:0"], ["bug/isnan:0"], name="bug/isnan"),
             helper.make_node("Cast", ["bug/isnan:0"], ["post/cast:0"], name="post/cast", to=f),
             helper.make_node("Add", ["post/cast:0", "one"], ["y"], name="post/add"),
             helper.make_node("Exp", ["x"], ["z"], name="side/exp")]
    io = [helper.make_tensor_value_info(name, f, [2, 4]) for name in ("x", "y", "z")]
    weights = [numpy_helper.from_array(np.float32(2), "two"), numpy_helper.from_array(np.float32(1), "one")]
    graph = helper.make_graph(nodes, "isnan", io[:1], io[1:], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model, {"x": np.linspace(-1, 2, 8, dtype=np.float32).reshape(2, 4)}


# ------------------------------------------------------------------ the repro.py template and failure identity
def test_the_repro_template_is_a_runnable_script_in_the_package():
    from tvm_probe.tools.reduce import REPRO_TEMPLATE, repro_template

    import tvm_probe

    path = __import__("pathlib").Path(tvm_probe.__file__).parent / REPRO_TEMPLATE
    text = repro_template()
    assert text == path.read_text()
    compile(text, str(path), "exec")  # valid Python as it stands, not only once filled in
    assert _imported_packages(text) == {"sys", "pathlib", "numpy", "onnx", "onnxruntime", "tvm"}
    # run as it stands (its placeholder settings), beside no model: it fails on the missing file
    done = subprocess.run([sys.executable, "-I", str(path)], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "model.onnx" in done.stderr


def test_a_written_repro_sets_every_setting():
    _, result = _reduced("slice_empty_negative_step")
    from tvm_probe.tools.reduce import repro_script

    script = repro_script(result)
    assert "TARGET = 'llvm'\n" in script and "REFERENCE = None  # None: onnxruntime" in script
    assert "$" not in script.split('"""')[1], "the docstring's placeholders are filled in"
    assert "TOLERANCES = {" in script


def test_same_compile_failure_up_to_numbers_only():
    from tvm_probe.core.errors import failure_identity

    a = CompileFailure("compile", "InternalError", "Check failed: lv12 at 0x7f00aa in src/relax/op.cc:81: ndim 3")
    b = CompileFailure("compile", "InternalError", "Check failed: lv3 at 0x55bb in src/relax/op.cc:90: ndim 3")
    assert a.same_as(b) and a.core == failure_identity("InternalError", b.message)
    assert not a.same_as(CompileFailure("compile", "InternalError", "Check failed: lv3 dtype"))
    assert not a.same_as(CompileFailure("compile", "ValueError", a.message))
    assert not a.same_as(CompileFailure("import", "InternalError", a.message))


def test_rounding_is_not_a_tvm_bug_unless_exact():
    """Under tolerance 0 TVM's ReduceMean of 16k values differs from onnxruntime's by a few ulps
    (another summation order): reduce calls that rounding, and reduces it only with exact=True."""
    from onnx import TensorProto, helper

    from tvm_probe.core.tolerance import EXACT, rounding
    from tvm_probe.tools.reduce import ReduceError, reduce

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4096])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])
    graph = helper.make_graph([helper.make_node("ReduceMean", ["x"], ["m"], name="mean", keepdims=1),
                               helper.make_node("Relu", ["m"], ["y"], name="relu")], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    inputs = {"x": np.random.default_rng(0).standard_normal((4, 4096)).astype(np.float32) + 1}
    found = reduce(model, inputs, tolerance=EXACT, exact=True)
    assert found.failure.node == "mean" and 0 < found.failure.max_abs
    got, want = found.actual["m"], found.expected["m"]
    assert not np.array_equal(got, want) and rounding(got, want).all()  # a difference, of a few ulps
    with pytest.raises(ReduceError, match="within 8 ulps count as rounding: --exact counts them"):
        reduce(model, inputs, tolerance=EXACT)
