"""Plain records of what happened to a model on its way through TVM, as a dump keeps them.

The import fixes a model needed and TVM's compile warnings in source terms: made by the importer
and the diagnosis, written into dumps, read back by :mod:`tvm_probe.store` with numpy alone.
"""
from __future__ import annotations

from dataclasses import dataclass

from .describe import describe_ops


@dataclass(frozen=True)
class AppliedFix:
    """An import fix a model needed: which one, and every source op it touched.

    ``sources`` are ONNX node names (the output tensor name of an unnamed node) or fx node names.
    """

    name: str
    does: str
    symptom: str
    sources: tuple[str, ...]

    def summary(self) -> str:
        """One line, e.g. ``constant_of_shape_scalar on 1 op (/bert/ConstantOfShape): ...``."""
        shown = ", ".join(self.sources[:3]) + (f" and {len(self.sources) - 3} more" if len(self.sources) > 3 else "")
        ops = f"{len(self.sources)} op{'s' if len(self.sources) != 1 else ''}"
        return f"import fix {self.name} on {ops} ({shown}): {self.does}"

    def to_record(self) -> dict:
        """A JSON-friendly dict (the inverse of :meth:`from_record`)."""
        return {"name": self.name, "does": self.does, "symptom": self.symptom, "sources": list(self.sources)}

    @classmethod
    def from_record(cls, rec: dict) -> "AppliedFix":
        """Rebuild from :meth:`to_record` output (e.g. a dump manifest's ``import_fixes``)."""
        return cls(name=str(rec["name"]), does=str(rec["does"]), symptom=str(rec["symptom"]),
                   sources=tuple(str(s) for s in rec["sources"]))


@dataclass(frozen=True)
class CompileWarning:
    """A warning TVM printed while compiling, and the source ops it concerns.

    Attributes:
        message: TVM's words, e.g. ``Detected pow(x, y) where y >= 3, ...``.
        keys: the source values (keys of the SourceMap) of the ops that make TVM print it, in
            source order; empty when it could not be attributed to ops (see ``where``).
        where: the pass that printed it (``LegalizeOps``) or ``build`` (code generation).
        ops: the Relax ops of those bindings (``relax.power``); empty when not attributed.
    """

    message: str
    keys: tuple[str, ...] = ()
    where: str = ""
    ops: tuple[str, ...] = ()

    def summary(self, sources=None) -> str:
        """One line: ``TVM warns at source op 'cube' (Pow): Detected pow(x, y) ...`` (names from ``sources``)."""
        if not self.keys:
            return f"TVM warns ({self.where}, not tied to a source op): {self.message}"
        return f"TVM warns at {describe_ops(self.keys, sources)}: {self.message}"

    def to_record(self) -> dict:
        """A JSON-friendly dict (the inverse of :meth:`from_record`)."""
        return {"message": self.message, "keys": list(self.keys), "where": self.where, "ops": list(self.ops)}

    @classmethod
    def from_record(cls, rec: dict) -> "CompileWarning":
        return cls(message=str(rec["message"]), keys=tuple(str(k) for k in rec.get("keys", ())),
                   where=str(rec.get("where", "")), ops=tuple(str(o) for o in rec.get("ops", ())))
