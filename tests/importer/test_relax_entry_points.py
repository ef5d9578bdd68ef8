"""Which functions of a Relax IRModule a probe runs: every module ``tvm.compile`` takes (issue 55).

Bug reports build modules by hand — ``tvm.IRModule({"main": func})`` with a function that carries
no ``global_symbol`` — and ``tvm.compile`` builds and runs them (its AttachGlobalSymbol names
every function after its GlobalVar).  A function without one that another function calls (a
TVMScript ``private=True`` helper) is a helper, not an entry point.
"""
from __future__ import annotations

import numpy as np
import pytest

tvm = pytest.importorskip("tvm")
from tvm import relax  # noqa: E402
from tvm.script import ir as I  # noqa: E402
from tvm.script import relax as R  # noqa: E402

from tvm_probe import Probe  # noqa: E402
from tvm_probe.core.errors import ModelError  # noqa: E402


def bare_module():
    """``x + x`` then ReLU, as a bug report builds it: no ``global_symbol`` anywhere."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType([2, 3], "float32"))
    with bb.function("f", [x]):
        with bb.dataflow():
            doubled = bb.emit(relax.op.add(x, x), name_hint="doubled")
            out = bb.emit_output(bb.emit(relax.op.nn.relu(doubled), name_hint="activated"))
        bb.emit_func_output(out)
    func = bb.get()["f"].without_attr("global_symbol")
    assert func.attrs is None or "global_symbol" not in func.attrs
    return tvm.IRModule({"main": func})


@I.ir_module
class WithPrivateHelper:
    @R.function(private=True)
    def helper(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
        scaled = R.multiply(x, R.const(3.0, "float32"))
        return scaled

    @R.function
    def main(x: R.Tensor((2, 3), "float32")) -> R.Tensor((2, 3), "float32"):
        cls = WithPrivateHelper
        tripled = cls.helper(x)
        shifted = R.add(tripled, R.const(1.0, "float32"))
        return shifted


X = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)


def test_a_function_without_global_symbol_runs_as_tvm_compile_runs_it():
    mod = bare_module()
    plain = relax.VirtualMachine(tvm.compile(mod, "llvm"), tvm.cpu())["main"](tvm.runtime.tensor(X)).numpy()
    probe = Probe.from_relax(mod)
    assert list(probe.functions) == ["main"]
    out = probe.run({"x": X})
    np.testing.assert_array_equal(probe.get("doubled"), X + X)
    np.testing.assert_array_equal(probe.get("activated"), np.maximum(X + X, 0))
    np.testing.assert_array_equal(next(iter(out.values())), plain)


def test_a_private_helper_is_not_an_entry_point():
    probe = Probe.from_relax(WithPrivateHelper)
    assert list(probe.functions) == ["main"]
    probe.run({"x": X})
    np.testing.assert_allclose(probe.get("shifted"), X * 3 + 1)


def test_a_module_whose_every_function_is_called_says_what_to_do():
    x = relax.Var("x", relax.TensorType([2], "float32"))
    gv_a, gv_b = relax.GlobalVar("a"), relax.GlobalVar("b")
    calls_b = relax.Function([x], relax.Call(gv_b, [x]), relax.TensorType([2], "float32"))
    y = relax.Var("y", relax.TensorType([2], "float32"))
    calls_a = relax.Function([y], relax.Call(gv_a, [y]), relax.TensorType([2], "float32"))
    with pytest.raises(ModelError, match=r"no Relax function to run \(every one is called by another\): give the "
                                         r"entry function a global_symbol"):
        Probe.from_relax(tvm.IRModule({gv_a: calls_b, gv_b: calls_a}))
