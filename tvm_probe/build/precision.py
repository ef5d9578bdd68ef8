"""Lowering: ToMixedPrecision before the pipeline, source tags moved, keep_fp32 (see :mod:`tvm_probe.tools.precision`)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from ..core.errors import NameLookupError, TVMBehaviourChanged, TVMCompileError, one_line
from ..core.names import NameIndex
from ..core.precision import PrecisionError, PrecisionSpec, parse_precision
from ..core.sources import Kind

_PREFIX = "tp"  # unique binding names: tp<index>_<old name>; TVM's fresh names are lv<N>/gv<N>


@dataclass
class Lowered:
    """What :func:`lower_precision` did: the spec, the source keys kept in fp32, the keys whose
    Var the pass dropped (explicitly unknown), and the dtype each tagged value has now."""

    spec: PrecisionSpec
    kept_keys: tuple[str, ...] = ()
    dropped: dict[str, str] = field(default_factory=dict)
    dtypes: dict[str, str] = field(default_factory=dict)

    def check(self, probe) -> None:
        """Raise unless every kept op is float32 in the build of ``probe`` (made from the lowered
        model; it takes this record with ``precision=``)."""
        problems = check_kept(probe, self.kept_keys)
        if problems:
            raise TVMBehaviourChanged("keep_fp32 did not keep these ops in float32: " + "; ".join(problems))


def lower_precision(imported, precision):
    """The imported model with its module converted to reduced precision, source tags moved.

    Returns ``(imported, lowered)``: a copy of ``imported`` whose ``mod`` is the reduced module
    (what the pipeline then compiles, unchanged) and whose ``var_keys`` point at the Vars holding
    each source op's value there; and a :class:`Lowered` record.  See the module docstring.
    """
    import tvm
    from tvm import relax

    spec = parse_precision(precision)
    main = imported.mod["main"]
    keep_keys = resolve_names(imported.sources, spec.keep_fp32) if spec.keep_fp32 else ()
    keep_vars = _bindings_of_ops(main, imported.var_keys, keep_keys)
    mod, renamed = _rename_and_keep(imported.mod, keep_vars)
    try:
        with tvm.transform.PassContext(opt_level=3):
            low = spec.pass_(mod) if spec.pass_ is not None else relax.transform.ToMixedPrecision(spec.accumulate)(mod)
    except Exception as err:  # noqa: BLE001 - any failure of TVM's pass is reported as one line
        raise TVMCompileError(f"the precision pass ({spec.describe()}) failed on this model ({one_line(err)}): "
                              "try keep_fp32 for the op it names, or no precision") from None
    by_name = {b.var.name: b.var for b in _bindings(low["main"])}
    params = set(low["main"].params)
    var_keys, dropped, dtypes = {}, {}, {}
    for var, keys in imported.var_keys.items():
        new = var if var in params else by_name.get(renamed.get(var, ""))
        if new is None:
            for key in keys:
                dropped[key] = f"the precision pass ({spec.describe()}) removed the binding that computed it"
            continue
        var_keys[new] = list(keys)
        for key in keys:
            dtypes[key] = str(getattr(new.ty, "dtype", ""))
    sources = imported.sources.copy()
    for key, dtype in dtypes.items():
        if dtype and sources[key].dtype is not None:
            sources[key].dtype = dtype
    lowered = Lowered(spec=spec, kept_keys=tuple(keep_keys), dropped=dropped, dtypes=dtypes)
    return replace(imported, mod=low, var_keys=var_keys, sources=sources), lowered


def resolve_names(sources, names: Sequence[str]) -> tuple[str, ...]:
    """Source keys of the run-time values ``names`` name (any name a value answers to, or a glob);
    every output of a named multi-output op.  Raises PrecisionError for a name that names none."""
    index = NameIndex(sources)
    keys: list[str] = []
    for name in names:
        try:
            matched = index.match(name)
        except NameLookupError as err:  # says what is close
            raise PrecisionError(f"keep_fp32: {one_line(err)}") from None
        for key in matched:
            value = sources[key]
            if value.kind is not Kind.VALUE:
                raise PrecisionError(f"keep_fp32: {name!r} is a {value.kind.value}, not an op computed at "
                                     "run time: name the ops to keep in fp32")
            siblings = [v.key for v in sources if value.node and v.node == value.node] or [key]
            keys.extend(k for k in siblings if k not in keys)
    return tuple(keys)


def _bindings(func):
    for block in func.body.blocks:
        yield from block.bindings


def _bindings_of_ops(main, var_keys, keys) -> set:
    """The binding Vars of ``main`` that compute the source ops ``keys``: from each op's value back
    to the tagged values (or parameters) it reads."""
    wanted = set(keys)
    tagged = set(var_keys)
    outs = [v for v, ks in var_keys.items() if wanted & set(ks)]
    return {b.var for b in op_slice(main, outs, tagged)}


def op_slice(main, outs, stop) -> list:
    """Bindings of ``main`` computing ``outs`` from Vars in ``stop`` (which are not included,
    except the ``outs`` themselves), parameters and constants, in order."""
    from tvm import relax

    order = {b.var: (i, b) for i, b in enumerate(_bindings(main))}
    needed, stack, seen = [], list(outs), set()
    roots = set(outs)
    while stack:
        var = stack.pop()
        if var in seen or var not in order or (var in stop and var not in roots):
            continue
        seen.add(var)
        needed.append(order[var])
        stack.extend(relax.analysis.free_vars(order[var][1].value))
    return [b for _, b in sorted(needed, key=lambda ib: ib[0])]


def _rename_and_keep(mod, keep_vars):
    """``mod`` with every binding of ``main`` renamed uniquely (see module docstring) and the
    bindings in ``keep_vars`` legalized to ``call_tir``; and old Var → new name."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    renamed: dict = {}

    @mutator
    class _Rewrite(PyExprMutator):
        def visit_var_binding_(self, binding):
            value = self.visit_expr(binding.value)
            if binding.var in keep_vars:
                value = _legalized(self.builder_, value)
            value = self.builder_.normalize(value)
            name = f"{_PREFIX}{len(renamed)}_{binding.var.name}"
            cls = relax.DataflowVar if isinstance(binding.var, relax.DataflowVar) else relax.Var
            new = cls(name, value.ty if binding.var in keep_vars else binding.var.ty)
            self.builder_.emit_normalized(relax.VarBinding(new, value))
            self.set_var_remap(binding.var, new)
            renamed[binding.var] = name

    # a copy: the builder adds the legalized kernels to the module it was given, in place
    work = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    rewriter = _Rewrite(work)
    main = rewriter.visit_expr(work["main"])
    out = rewriter.builder_.get()
    out["main"] = main
    return out, renamed


def _legalized(builder, value):
    """``value`` (a call of a Relax op) as the ``call_tir`` LegalizeOps would make of it, each
    float tensor argument read through an ``astype`` to its own dtype.

    The ``astype`` is a barrier: where ToMixedPrecision stores a producer in fp16 it becomes the
    cast back to fp32, and the ``call_tir`` keeps its arguments — TVM 0.27's ToMixedPrecision
    fails ("Expected TensorType, but got R.Callable") when it has to rewrite a ``call_tir``'s
    arguments itself.
    """
    import tvm
    from tvm import relax

    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return value
    legalize = value.op.get_attr("FLegalize")
    if legalize is None:
        return value
    call = builder.normalize(legalize(builder, value))
    if not (isinstance(call, relax.Call) and getattr(call.op, "name", "") == "relax.call_tir"
            and isinstance(call.args[1], relax.Tuple)):
        return call
    fields = [builder.emit(relax.op.astype(f, f.ty.dtype)) if _is_float_var(f) else f for f in call.args[1].fields]
    return relax.Call(call.op, [call.args[0], relax.Tuple(fields), *call.args[2:]], call.attrs, call.ty_args)


def _is_float_var(expr) -> bool:
    from tvm import relax

    return isinstance(expr, relax.Var) and isinstance(expr.ty, relax.TensorType) and \
        str(expr.ty.dtype).startswith("float")


def check_kept(probe, kept_keys) -> list[str]:
    """Problems with the built module's dtypes: each kept value must be computed in float32 by the
    compiled kernels (``probe.built_dtype``, read from the kernel map of the built module); [] when all are."""
    problems = []
    for key in kept_keys:
        dtype = probe.built_dtype(key) or ""
        if dtype not in ("float32", "float64") and dtype.startswith("float"):
            problems.append(f"{probe.imported.sources[key].display_name} is {dtype} in the built module")
    return problems
