"""The reproduction TVM developers write: the module right before the pass, as TVMScript, and the pass.

``repro.py`` needs tvm and numpy only.  It holds the module as TVMScript; the constants of its
``main`` are lifted into parameters first and stored in ``params.npz`` (TVM 0.27 crashes printing
or serialising a module that holds constants: ``mod.script(show_meta=True)`` and ``save_json``
both segfault in ``ToJSONGraph``), and bound back with ``BindParams`` — so the pass receives the
module it received in the pipeline.

* a pass that raises: the pass alone on the module before it; when that does not fail the same
  way (the pass needs what an earlier pass left, or its defaults differ from the pipeline's), the
  smallest ordered subsequence of the pipeline's earlier steps that, with it, still fails — found
  by delta debugging (ddmin) from the imported module;
* a pass after which a value is wrong: the module before it and after it, each finished with
  ``default_build`` and run on ``inputs.npz``; the outputs are checked against ``expected.npz``
  (the reference's), and the script fails with ``MISMATCH`` when the pass made them wrong.

The folder is written to a temporary sibling, ``repro.py`` is run there in a fresh process and
must reproduce (the same failure up to its numbers: :func:`tvm_probe.core.errors.failure_identity`),
then the folder is moved into place.
"""
from __future__ import annotations

import logging
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...build.compile import target_literal
from ...core.errors import ProbeError, failure_identity, one_line, same_failure_as
from ...core.minimize import ddmin
from ...core.native_log import native_log_to_logging, release_native
from ...core.tolerance import default_tolerance
from ...store.atomic import replace_folder
from ...store.npz import save_npz

log = logging.getLogger(__package__)

REPRO_TIMEOUT_S = 600
_NAMESPACES = ("tvm.relax.transform", "tvm.transform")


def pass_constructor(name: str) -> str | None:
    """``"relax.transform.FuseTIR()"`` for a pass TVM makes by that name with no arguments, or None."""
    import importlib

    for namespace in _NAMESPACES:
        factory = getattr(importlib.import_module(namespace), name, None)
        if callable(factory):
            try:
                factory()
            except Exception:  # it needs arguments
                return None
            return f"{namespace.removeprefix('tvm.')}.{name}()"
    return None


def _make(constructor: str):
    """The pass ``constructor`` (a :func:`pass_constructor` text) makes."""
    import tvm
    from tvm import relax

    return eval(constructor, {"tvm": tvm, "relax": relax, "transform": tvm.transform})


def lift_constants(mod) -> tuple[Any, dict[str, np.ndarray]]:
    """``mod`` with every constant of ``main`` a parameter of ``main`` (appended), and their values.

    Raises:
        ProbeError: another Relax function holds constants (they cannot be lifted into ``main``).
    """
    import tvm
    from tvm import relax

    found: list[tuple[Any, np.ndarray]] = []

    @relax.expr_functor.mutator
    class Lift(relax.PyExprMutator):
        def visit_generic_const_(self, const):
            var = relax.Var(f"lifted_const_{len(found)}", const.ty)
            found.append((var, const.value.numpy()))
            return var

    for gv, func in mod.functions.items():
        if gv.name_hint != "main" and isinstance(func, relax.Function) and _has_constant(func):
            raise ProbeError(f"the module's function {gv.name_hint} holds constants, which TVM 0.27 cannot print "
                             "as TVMScript: no standalone reproduction can be written")
    main = mod["main"]
    body = Lift().visit_expr(main.body)
    if not found:
        return mod, {}
    lifted = relax.Function(list(main.params) + [v for v, _ in found], body, main.ret_ty,
                            main.is_pure, main.attrs, main.span)
    out = tvm.IRModule(dict(mod.functions.items()), attrs=mod.attrs)
    out[mod.get_global_var("main")] = lifted
    return out, {v.name: a for v, a in found}


def _has_constant(func) -> bool:
    import tvm
    from tvm import relax

    seen = []
    relax.analysis.post_order_visit(func, lambda e: seen.append(1) if isinstance(e, tvm.ir.expr.GenericConst) else None)
    return bool(seen)


# ------------------------------------------------------------------ the two kinds of reproduction
@dataclass
class PassRepro:
    """A pass that raises: ``module`` (the module it starts from), the passes to run, the failure."""

    module: Any
    passes: list[str]               # constructors, e.g. "relax.transform.FuseTIR()"
    target: Any
    error_type: str
    message: str
    found_in: str                   # the pass path in the user's pipeline
    note: str = ""
    why_not: str = ""               # non-empty: no reproduction can be written, and why

    @classmethod
    def for_failure(cls, record, step, imported) -> "PassRepro":
        """The reproduction of ``step`` raising in ``record`` (the pipeline run that failed)."""
        repro = cls(step.module, [], record.target, record.error_type, record.message, step.path)
        want = failure_identity(record.error_type, record.message)
        alone = pass_constructor(step.name)
        if alone is None:
            repro.why_not = f"TVM cannot make the pass {step.name} by name without arguments"
            return repro
        if _fails_as(step.module, [alone], record.target, want):
            repro.passes = [alone]
            return repro
        if imported is None:
            repro.why_not = f"{step.name} alone on the module before it does not fail"
            return repro
        steps = record.passes.steps()
        earlier = [pass_constructor(s.name) for s in steps[:steps.index(step)]] if step in steps else []
        if None in earlier or not _fails_as(imported.mod, earlier + [alone], record.target, want):
            repro.why_not = (f"{step.name} alone on the module before it does not fail, and the pipeline's steps "
                             "cannot all be made by name")
            return repro
        # by index: a pipeline may run one pass twice (FoldConstant), and ddmin tells items apart by equality
        kept = ddmin(list(range(len(earlier))),
                     lambda sub: _fails_as(imported.mod, [earlier[i] for i in sub] + [alone], record.target, want))
        repro.module, repro.passes = imported.mod, [earlier[i] for i in kept] + [alone]
        repro.note = (f"{step.name} alone on the module right before it does not fail; these steps of the pipeline "
                      "from the imported module do (the smallest ordered subsequence, by delta debugging)")
        return repro


@dataclass
class ValueRepro:
    """A pass after which a value is wrong: the module before it, the pass, inputs and expected outputs."""

    module: Any
    passes: list[str]
    inputs: list
    expected: list                  # the reference's outputs, in the order main returns them
    output_names: list[str]
    found_in: str
    value: str
    why_not: str = ""

    @classmethod
    def for_pass(cls, step, div) -> "ValueRepro":
        """The reproduction of the value ``div`` going wrong in ``step``."""
        expected = [np.asarray(div.expected[n]) for n in div.outputs if n in div.expected]
        repro = cls(step.module, [], list(div.arrays), expected, list(div.outputs), step.path, div.name)
        alone = pass_constructor(step.name)
        if alone is None:
            repro.why_not = f"TVM cannot make the pass {step.name} by name without arguments"
        elif len(expected) != len(div.outputs) or any(a.dtype == object for a in expected):
            repro.why_not = "the reference gives no single array for some of the model's outputs"
        else:
            repro.passes = [alone]
        return repro


def _fails_as(mod, constructors: list[str], target, want: str) -> bool:
    """Whether running the passes ``constructors`` make on ``mod`` fails as ``want``."""
    with native_log_to_logging(forward=False):
        try:
            with target:
                for constructor in constructors:
                    mod = _make(constructor)(mod)
        except Exception as err:
            same = same_failure_as(err) == want
            release_native(err, collect=False)
            return same
    return False


# ------------------------------------------------------------------ the folder
def write_repro(blame, out_dir: Path, overwrite: bool = False) -> Path:
    """Write ``blame``'s reproduction folder (see the module docstring) and return it."""
    repro = blame.repro
    if repro is None:
        raise ProbeError(f"no reproduction for a blame of stage {blame.stage!r}: repro.py is written where a pass "
                         "is blamed")
    if repro.why_not:
        raise ProbeError(f"no standalone reproduction: {repro.why_not}")
    if out_dir.exists() and not overwrite:
        raise ProbeError(f"'{out_dir}' already exists: choose another folder or pass overwrite=True")
    module, params = lift_constants(repro.module)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.partial-", dir=out_dir.parent))
    try:
        save_npz(tmp / "params.npz", params)
        if isinstance(repro, ValueRepro):
            save_npz(tmp / "inputs.npz", {str(i): a for i, a in enumerate(repro.inputs)})
            save_npz(tmp / "expected.npz", {str(i): a for i, a in enumerate(repro.expected)})
        (tmp / "repro.py").write_text(_script(blame, repro, module))
        transcript = _run(tmp, repro)
        (tmp / "README.md").write_text(_readme(blame, repro, transcript))
        replace_folder(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _script(blame, repro, module) -> str:
    import tvm

    module_text = _with_imports(module.script())
    passes = ",\n    ".join(repro.passes)
    head = (f'"""TVM {tvm.__version__}: {blame.headline().removeprefix("blame: ")}.\n\n'
            f"Found by tvm_probe's blame in the pipeline at {repro.found_in}.  Run: python repro.py\n"
            f"(tvm and numpy only; params.npz holds main's constants, bound back as they were).\n\"\"\"\n")
    common = _COMMON.replace("TARGET_TEXT", target_literal(blame.target))
    body = _FAILURE if isinstance(repro, PassRepro) else _VALUE.replace("TOLERANCES", repr(_tolerances(repro))).replace(
        "PASS_TEXT", ", ".join(repro.passes))
    return (head + "import sys\nimport traceback\n\nimport numpy as np\nimport tvm\nfrom tvm import relax\n\n"
            f"{module_text}\n\nPASSES = [\n    {passes},\n]\n" + common + body)


def _with_imports(text: str) -> str:
    """TVMScript as ``mod.script()`` prints it, its imports (printed as comments) made real."""
    lines = text.splitlines()
    head = 0
    while head < len(lines) and lines[head].startswith(("# from ", "# import ")):
        lines[head] = lines[head][2:]
        head += 1
    return "\n".join(lines)


def _tolerances(repro: ValueRepro) -> list:
    out = []
    for array in repro.expected:
        tol = default_tolerance(array.dtype)
        out.append((tol.atol, tol.rtol))
    return out


_COMMON = '''
TARGET = tvm.target.Target(TARGET_TEXT)


def module():
    """The module the pass received (main's constants bound back from params.npz)."""
    params = dict(np.load("params.npz"))
    mod = Module
    if params:
        mod = relax.transform.BindParams("main", {k: tvm.runtime.tensor(v) for k, v in params.items()})(mod)
    return mod


def run_passes(mod):
    with TARGET:
        for p in PASSES:
            mod = p(mod)
    return mod

'''

_FAILURE = '''
if __name__ == "__main__":
    mod = module()
    try:
        run_passes(mod)
    except Exception as err:
        traceback.print_exc()
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"FAILED {type(err).__name__}: {first}")
        sys.exit(1)
    print("no failure: the passes ran (fixed in this TVM?)")
'''

_VALUE = '''

def outputs(mod):
    """mod finished with default_build, run on inputs.npz: main's outputs as numpy."""
    executable = tvm.compile(mod, TARGET, relax_pipeline="default_build")
    vm = relax.VirtualMachine(executable, tvm.cpu())
    inputs = np.load("inputs.npz")
    result = vm["main"](*[tvm.runtime.tensor(inputs[str(i)]) for i in range(len(inputs.files))])
    flat, todo = [], [result]
    while todo:
        item = todo.pop(0)
        if hasattr(item, "numpy"):
            flat.append(item.numpy())
        else:
            todo[:0] = list(item)
    return flat


def mismatches(got):
    expected = np.load("expected.npz")
    bad = []
    for i, ((atol, rtol), value) in enumerate(zip(TOLERANCES, got)):
        want = expected[str(i)]
        if value.shape != want.shape or not np.allclose(value, want, atol=atol, rtol=rtol, equal_nan=True):
            bad.append(i)
    return bad


if __name__ == "__main__":
    before = module()
    if mismatches(outputs(before)):
        print("the module before the pass already differs from expected.npz: not this reproduction's failure")
        sys.exit(2)
    bad = mismatches(outputs(run_passes(before)))
    for i in bad:
        print(f"MISMATCH output {i} after PASS_TEXT")
    sys.exit(1 if bad else 0)
'''


def _run(folder: Path, repro) -> str:
    try:
        done = subprocess.run([sys.executable, "repro.py"], cwd=folder, capture_output=True, text=True,
                              timeout=REPRO_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise ProbeError(f"repro.py did not finish within {REPRO_TIMEOUT_S} s; nothing was written") from None
    if isinstance(repro, PassRepro):
        line = next((l for l in done.stdout.splitlines() if l.startswith("FAILED ")), "")
        kind, _, message = line.removeprefix("FAILED ").partition(": ")
        shown = line and failure_identity(kind, message) == failure_identity(repro.error_type, repro.message.split("; ")[0]) \
            or line and kind == repro.error_type and _same_start(message, repro.message)
    else:
        shown = "MISMATCH output" in done.stdout
    if done.returncode != 1 or not shown:
        text = (done.stdout + done.stderr).strip().splitlines()
        raise ProbeError(f"repro.py does not reproduce the failure standalone (exit status {done.returncode}: "
                         f"{one_line(text[-1]) if text else 'no output'}); nothing was written. Please report this")
    return done.stdout


def _same_start(a: str, b: str) -> bool:
    """The same message up to its numbers, as far as the shorter one goes (TVM's one-line form
    joins the lines a plain ``str(err)`` keeps apart)."""
    x, y = failure_identity("", a), failure_identity("", b)
    return bool(x.strip(":")) and (x.startswith(y[:60]) or y.startswith(x[:60]))


def _readme(blame, repro, transcript: str) -> str:
    passes = ", ".join(repro.passes)
    lines = [f"# {blame.headline()}", "", *blame.evidence, "",
             f"`repro.py` runs {passes} on the module right before it in the pipeline "
             f"(found at `{repro.found_in}`), written as TVMScript.",
             *([repro.note] if getattr(repro, "note", "") else []), "",
             "Run `python repro.py` (tvm and numpy only). It printed, when tvm_probe checked it:", "", "```text",
             transcript.strip(), "```", ""]
    return "\n".join(lines)
