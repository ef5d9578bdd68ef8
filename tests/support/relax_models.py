"""Relax modules written with TVM's BlockBuilder for the tests."""
from __future__ import annotations


def refusing_module(name: str):
    """``exp → a packed kernel that raises → add``: TVM fails while running it.  The packed
    kernel is registered as ``name``; its output is ``z``, ``exp``'s ``y``, ``add``'s ``w``.

    Returns the module and its Vars ``(x, y, z, w)``."""
    import tvm
    from tvm import relax

    @tvm.register_global_func(name, override=True)
    def _refuse(x, out):
        raise ValueError("the custom kernel refuses its input")

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.exp(x))
            z = bb.emit(relax.call_dps_packed(name, (y,), out_ty=relax.TensorType((4,), "float32")))
            w = bb.emit_output(relax.op.add(z, y))
        bb.emit_func_output(w)
    return bb.get(), (x, y, z, w)
