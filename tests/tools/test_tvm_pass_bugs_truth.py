"""The ground truth of tests/support/tvm_pass_bugs.py (real pass bugs of apache-tvm 0.27, rebuilt
from apache/tvm reports), re-established by hand with plain TVM and numpy — not by ``blame``, which
these cases are meant to test.  A failure here after a TVM upgrade means a bug changed or was fixed:
update the entry and tvm_pass_bugs.md, don't loosen the check."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from support.tvm_pass_bugs import (BUGS, check, constants_roundtrip, experiment, has_tensor_constants,
                                   module_before, run_module, same_values, script_roundtrip)


@pytest.mark.parametrize("name", sorted(BUGS))
def test_ground_truth(name):
    """The pipeline fails (or computes wrong values) where the entry says, with the error it says;
    applied one at a time, its steps single out the same pass; the module that pass receives is
    well-formed and computes numpy's values."""
    finding = experiment(name)
    assert check(BUGS[name], finding) == [], "\n".join(finding.log)


def test_the_table_has_both_kinds_in_several_passes():
    passes = {kind: {b.guilty_pass for b in BUGS.values() if b.kind == kind} for kind in ("compile", "wrong-value")}
    assert passes["compile"] == {"FuseTIR", "CombineParallelMatmul"}
    assert passes["wrong-value"] == {"ExpandMatmulOfSum", "ReorderTakeAfterMatmul"}
    assert all(b.upstream.startswith("apache/tvm#") and b.url.endswith(b.upstream.split("#")[1])
               for b in BUGS.values())


@pytest.mark.parametrize("name", sorted(BUGS))
def test_module_before_round_trips_through_tvmscript(name):
    """The module the guilty pass receives survives print + parse (lifting tensor constants into
    parameters first, where it has some), and the guilty pass still misbehaves on the parsed one."""
    bug = BUGS[name]
    before = module_before(name)
    parsed = constants_roundtrip(before) if has_tensor_constants(before) else script_roundtrip(before)
    assert has_tensor_constants(before) == name.endswith("_const_weights")
    (guilty,) = [step for step in bug.steps() if step.info.name == bug.guilty_pass]
    if bug.kind == "compile":
        with pytest.raises(bug.error_type) as raised:
            if bug.target:
                import tvm

                with tvm.target.Target(bug.target):
                    guilty(parsed)
            else:
                guilty(parsed)
        assert bug.error_text in str(raised.value)
    else:
        inputs = bug.inputs()
        assert not same_values(run_module(guilty(parsed), inputs), bug.expected(inputs))


def _crashes(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120)


def test_tvm_027_segfaults_printing_a_tensor_constant_with_its_metadata():
    """Why :func:`constants_roundtrip` lifts constants first: ``script(show_meta=True)`` of a module
    with a tensor constant kills the process in TVM 0.27.0.post1 (scalars print inline, fine)."""
    result = _crashes("""
        import numpy as np, tvm
        from tvm import relax
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType((2,), "float32"))
        with bb.function("main", [x]):
            with bb.dataflow():
                out = bb.emit_output(relax.op.add(x, relax.const(np.ones(2, "float32"))))
            bb.emit_func_output(out)
        bb.get().script(show_meta=True)
        print("printed")
    """)
    assert result.returncode != 0 and "printed" not in result.stdout
    assert "ToJSONGraph" in result.stderr


def test_tvm_027_segfaults_in_save_json_on_any_ir_node():
    """Why ``tvm.ir.load_json(tvm.ir.save_json(mod))`` is no alternative: it dies on a bare Relax Var."""
    result = _crashes("""
        import tvm
        from tvm import relax
        tvm.ir.save_json(relax.Var("x", relax.TensorType((2,), "float32")))
        print("saved")
    """)
    assert result.returncode != 0 and "saved" not in result.stdout
