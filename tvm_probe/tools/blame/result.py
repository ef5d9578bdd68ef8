"""What :func:`~tvm_probe.tools.blame.blame` found: :class:`Blame`, the stage and its evidence."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...core.schema import DEFAULT_TARGET

#: The stages a blame names.  ``undecided``: the imported module is already wrong, and no
#: independent evaluation of its op tells the importer from the kernel (never guessed).
STAGES = ("importer", "pass", "kernel", "runtime-crash", "none", "undecided")


@dataclass
class Blame:
    """Which stage of TVM is responsible for a failure, with the evidence.

    Attributes:
        stage: one of :data:`STAGES`.
        failure: what went wrong: ``"compile"``, ``"divergence"``, ``"crash"``, ``"run"`` or ``""``
            (nothing: stage ``none``).
        value: the source name the failure concerns (the first divergent value, the op that fails).
        pass_name: the pass blamed (``"FuseTIR"``), stage ``pass``.
        pass_path: where it ran, its enclosing passes first (``"_pipeline>sequential>FuseTIR"``).
        kernel: the kernel symbol, for a crash or a kernel blame (or the op whose legalization fails).
        primfunc: the op's kernel as TVMScript, for a kernel blame.
        evidence: the lines that show it (``str(blame)`` prints them).
        builds: how many TVM builds the blame took; seconds: how long.
    """

    stage: str
    failure: str = ""
    value: str | None = None
    pass_name: str | None = None
    pass_path: str | None = None
    kernel: str | None = None
    primfunc: str | None = None
    evidence: list[str] = field(default_factory=list)
    builds: int = 0
    seconds: float = 0.0
    target: Any = DEFAULT_TARGET  # as given to blame (a kind, a dict, a Target)
    repro: Any = field(default=None, repr=False)  # a .repro.Repro, or why none can be written (str)

    def headline(self) -> str:
        """One line: ``blame: pass FuseTIR (_pipeline>sequential>FuseTIR) — compile failure``."""
        where = {"pass": f" {self.pass_name} ({self.pass_path})", "kernel": f" {self.kernel or ''}",
                 "runtime-crash": f" {self.kernel or ''}"}.get(self.stage, "")
        what = {"compile": "compile failure", "divergence": f"wrong value of {self.value}",
                "crash": "crash", "run": "run failure"}.get(self.failure, "nothing wrong found")
        return f"blame: {self.stage}{where.rstrip()} — {what}"

    def __str__(self) -> str:
        lines = [self.headline(), *(f"  {line}" for line in self.evidence)]
        if self.primfunc:
            lines += ["  the op's kernel:", *(f"    {line}" for line in self.primfunc.splitlines())]
        lines.append(f"  ({self.builds} build{'' if self.builds == 1 else 's'}, {self.seconds:.1f} s)")
        return "\n".join(lines)

    def write_repro(self, out_dir, overwrite: bool = False) -> Path:
        """Write the standalone reproduction (``repro.py``, tvm and numpy only, with what it reads)
        to ``out_dir``; it is run first and must reproduce.  See :mod:`.repro`.

        Raises:
            ProbeError: no reproduction can be written for this blame (it says why), it did not
                reproduce, or ``out_dir`` exists (``overwrite=True`` replaces it).
        """
        from .repro import write_repro

        return write_repro(self, Path(out_dir), overwrite)
