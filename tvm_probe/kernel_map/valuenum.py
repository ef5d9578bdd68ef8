"""Value numbering of Relax functions: equal numbers mean equal run-time values.

Every expression of a Relax function gets a *term*: the op, its attributes and the terms of its
arguments, with the function's parameters, constants and callees as leaves.  Terms are
hash-consed into small integers, so two bindings with the same number compute the same op on
the same values — and, the ops being pure, hold the same tensor.  This is what lets the kernel
map say "this kernel output *is* that source value" by construction instead of by guessing:

* two identical computations (``x.mean()`` written twice) get one number, and every source
  name on either is served by whichever copy the compiled module keeps;
* a tuple element ``t[k]`` of a tuple literal is the element itself, and ``a = b`` is ``b``,
  so views, aliases and multi-output ops need no special cases;
* a call of a grouped function (what FuseOps creates) is *inlined* per call site: its
  parameters take the numbers of that call's arguments, so the bindings inside get numbers
  that belong to that call site, not to the function (FuseOps shares one function between
  structurally equal groups, e.g. every BERT layer).

Leaves are compared by identity (constants) or by name (functions): a number never claims two
values are equal unless they are.  Anything this module does not understand gets a number of
its own (never equal to another), which can only make the map say "unknown", never lie.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Ops whose result is not a function of their arguments alone; each call is its own value.
_IMPURE_OPS = frozenset({"relax.call_builtin_with_ctx", "relax.null_value", "relax.print",
                         "relax.assert_op", "relax.call_inplace_packed"})


def _size_arithmetic() -> tuple:
    """The TIR expression types :meth:`ValueNumbering._dim` numbers by their operands."""
    from tvm.ir.prim import expr as prim

    return (prim.BinaryOpExpr, prim.CmpExpr, prim.Cast)


class Terms:
    """The hash-consing table: term tuple ↔ number, shared by every function evaluated."""

    def __init__(self):
        self._numbers: dict[tuple, int] = {}
        self._terms: list[tuple] = []

    def number(self, term: tuple) -> int:
        """The number of ``term`` (a tuple of strings, ints and numbers), made on first use."""
        found = self._numbers.get(term)
        if found is None:
            found = self._numbers[term] = len(self._terms)
            self._terms.append(term)
        return found

    def term(self, number: int) -> tuple:
        return self._terms[number]

    def param(self, index: int) -> int:
        """The number of ``main``'s parameter ``index`` (a model input)."""
        return self.number(("param", index))

    def tuple_item(self, tuple_number: int, index: int) -> int:
        """The number of element ``index`` of a tuple value: the element itself for a literal."""
        term = self._terms[tuple_number]
        if term[0] == "tuple" and index < len(term) - 1:
            return term[index + 1]
        return self.number(("item", tuple_number, index))

    def is_constant(self, number: int) -> bool:
        return self._terms[number][0] == "const"


@dataclass
class InlinedCall:
    """One call site of a grouped function, evaluated with that site's argument numbers.

    Attributes:
        call: the Relax call of the grouped function.
        inner: number of every binding Var inside the callee, for this call site.
        result: number of the call's value.
    """

    call: Any
    inner: dict = field(default_factory=dict)
    result: int = -1


@dataclass
class FunctionValues:
    """Numbers of one evaluated function: per parameter and bound Var, the body, inlined calls."""

    of_var: dict = field(default_factory=dict)
    body: int = -1
    inlined: dict = field(default_factory=dict)
    bound: dict = field(default_factory=dict)  # bound Var → the value bound to it (as written)


class ValueNumbering:
    """Evaluates Relax functions into a shared :class:`Terms` table (see module docstring)."""

    def __init__(self, terms: Terms | None = None):
        self.terms = terms or Terms()

    def main(self, mod, inline: bool = False) -> FunctionValues:
        """Numbers of every binding of ``mod["main"]``; grouped functions inlined if asked."""
        main = mod["main"]
        params = [self.terms.param(i) for i in range(len(main.params))]
        return self.function(main, params, mod, inline)

    def function(self, func, param_numbers, mod=None, inline: bool = False, symbols=None) -> FunctionValues:
        """Numbers of ``func``'s bindings when its parameters hold ``param_numbers`` (and its
        symbolic dimensions the numbers in ``symbols``)."""
        out = FunctionValues()
        env = dict(zip(func.params, param_numbers))
        out.of_var.update(env)
        env.update(symbols or {})
        for block in func.body.blocks:
            for binding in block.bindings:
                value = binding.value
                if inline and self._is_grouped_call(value, mod):
                    call = self._inline(value, env, mod)
                    out.inlined[binding.var] = call
                    number = call.result
                elif value in out.inlined:  # `gv = lv`: later passes may keep either Var
                    out.inlined[binding.var] = out.inlined[value]
                    number = env[value]
                else:
                    number = self._expr(value, env, binding)
                env[binding.var] = number
                out.of_var[binding.var] = number
                out.bound[binding.var] = value
        out.body = self._expr(func.body.body, env, None)
        return out

    # -- expressions ------------------------------------------------------------------------
    def _expr(self, expr, env, binding) -> int:
        """Number of ``expr``; ``binding`` gives opaque expressions a number of their own."""
        import tvm
        from tvm import relax

        t = self.terms
        if isinstance(expr, relax.Var):
            found = env.get(expr)
            return found if found is not None else t.number(("free", expr))
        if isinstance(expr, tvm.ir.expr.GenericConst):
            return t.number(("const", expr))  # by identity: equal data is not enough evidence
        if isinstance(expr, tvm.ir.expr.Constant):  # PrimValue, StringImm, DataTypeImm
            return t.number(("imm", type(expr).__name__, str(expr)))
        if isinstance(expr, relax.ShapeExpr):
            return t.number(("shape",) + tuple(self._dim(v, env) for v in expr.values))
        if isinstance(expr, relax.Tuple):
            return t.number(("tuple",) + tuple(self._expr(f, env, None) for f in expr.fields))
        if isinstance(expr, relax.TupleGetItem):
            return t.tuple_item(self._expr(expr.tuple_value, env, None), int(expr.index))
        if isinstance(expr, relax.GlobalVar):
            return t.number(("global", expr.name_hint))
        if isinstance(expr, relax.ExternFunc):
            return t.number(("extern", str(expr.global_symbol)))
        if isinstance(expr, relax.Call):
            return self._call(expr, env, binding)
        if isinstance(expr, _size_arithmetic()):  # a scalar argument computed from sizes (``n + 1``)
            return self._dim(expr, env)
        return t.number(("opaque", binding.var if binding is not None else expr))

    def _dim(self, value, env) -> int:
        """The number of one dimension of a shape: of its value, or of a symbolic one by
        *identity* — TVM prints every ``range_len_0`` it makes with the same name, so names
        would merge different sizes."""
        import tvm

        prim = tvm.ir.prim.expr
        if isinstance(value, prim.IntImm):
            return self.terms.number(("int", int(value.value)))
        if isinstance(value, tvm.ir.expr.Var):
            return self._expr(value, env, None)  # a symbol bound at a call site maps to the caller's
        if isinstance(value, (prim.BinaryOpExpr, prim.CmpExpr)):
            # arithmetic on sizes (a decode step's ``past + 1``): the same op on the same numbers,
            # so that it inside a fused function (whose symbols FuseOps renames) equals it outside
            return self.terms.number(("prim", type(value).__name__, self._dim(value.a, env), self._dim(value.b, env)))
        if isinstance(value, prim.Cast):
            return self.terms.number(("cast", str(value.ty), self._dim(value.value, env)))
        return self.terms.number(("prim", value))  # another expression: equal only to itself

    def _call(self, call, env, binding) -> int:
        import tvm

        op = call.op
        name = op.name if isinstance(op, tvm.ir.Op) else ""
        if name in _IMPURE_OPS or (not name and binding is not None and not self._pure_callee(op)):
            return self.terms.number(("opaque", binding.var if binding is not None else call))
        args = tuple(self._expr(a, env, None) for a in call.args)
        callee = name or ("fn", self._expr(op, env, None))
        attrs = str(call.attrs) if call.attrs is not None else ""
        sinfo = tuple(str(s) for s in call.ty_args)
        return self.terms.number(("call", callee, args, attrs, sinfo))

    @staticmethod
    def _pure_callee(op) -> bool:
        """Calls of a GlobalVar (a function of the module) are pure; packed functions may not be."""
        from tvm import relax

        return isinstance(op, relax.GlobalVar)

    # -- grouped functions ------------------------------------------------------------------
    @staticmethod
    def _is_grouped_call(value, mod) -> bool:
        from tvm import relax

        return (mod is not None and isinstance(value, relax.Call) and isinstance(value.op, relax.GlobalVar)
                and isinstance(mod[value.op], relax.Function))

    def _symbols(self, func, call, env) -> dict:
        """The callee's symbolic dimensions (defined by its parameters' shapes) as the numbers of
        the caller's dimensions at this call site, so shapes inside compare with shapes outside."""
        import tvm

        found = {}
        for param, arg in zip(func.params, call.args):
            inner, outer = _dims_defined(param.ty), _dims_defined(getattr(arg, "ty", None))
            if inner is None or outer is None or len(inner) != len(outer):
                continue
            for p_dim, a_dim in zip(inner, outer):
                if isinstance(p_dim, tvm.ir.expr.Var) and p_dim not in found:
                    found[p_dim] = self._dim(a_dim, env)
        return found

    def _inline(self, call, env, mod) -> InlinedCall:
        func = mod[call.op]
        numbers = [self._expr(a, env, None) for a in call.args]
        values = self.function(func, numbers, mod, inline=False, symbols=self._symbols(func, call, env))
        params = set(func.params)
        inner = {var: number for var, number in values.of_var.items() if var not in params}
        return InlinedCall(call=call, inner=inner, result=values.body)


def shape_dims(ty) -> list | None:
    """The dimensions of a tensor type whose shape is known (None: no type, or unknown rank)."""
    return getattr(getattr(ty, "shape", None), "values", None)


def _dims_defined(ty) -> list | None:
    """The dimensions a parameter of type ``ty`` defines: a tensor's shape, or the values of a
    shape (FuseOps passes the symbols a fused function needs but its tensors do not define as
    ``R.Shape([s15])``)."""
    from tvm import relax

    if isinstance(ty, relax.ShapeType):
        return getattr(ty, "values", None)
    return shape_dims(ty)
