"""Plain records of what happened to a model on its way through TVM, as a dump keeps them.

The import fixes a model needed, the sizes chosen for its unknown dimensions and TVM's compile warnings in source terms: made by the importer
and the diagnosis, written into dumps, read back by :mod:`tvm_probe.store` with numpy alone.
"""
from __future__ import annotations

from dataclasses import dataclass

from .describe import describe_ops
from .errors import Remedy, Terms


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


@dataclass(frozen=True)
class PinnedInput:
    """An input built with sizes chosen for dimensions the model leaves unknown, because TVM's
    importer could not follow them symbolically (or ``shapes`` pinned the other inputs).

    Attributes:
        name: the input.
        shape: the sizes it was built with.
        dims: ``(axis, declared name)`` of each dimension chosen here (``"?"`` for an unnamed one).
        from_inputs: the sizes are those of the arrays given for the run (else 1).
    """

    name: str
    shape: tuple[int, ...]
    dims: tuple[tuple[int, str], ...]
    from_inputs: bool = False

    def notice(self, terms: Terms | None = None) -> str:
        """One line: ``bytes: dimension 0 (unk__214) set to 1; choose with shapes={'bytes': (1, 2048)}``
        (in ``terms``: the CLI flag or YAML key)."""
        chosen = ", ".join(f"dimension {axis} ({label}) set to {self.shape[axis]}" for axis, label in self.dims)
        why = " (the size of the input given)" if self.from_inputs else ""
        said = self.remedy("choose with ").said(terms)
        return f"{self.name}: {chosen}{why}; " + (said if terms is None else f"to choose, {said}")

    def remedy(self, lead: str) -> Remedy:
        """Other sizes for this input (:func:`shapes_remedy`, ``lead`` before ``shapes=``)."""
        return shapes_remedy(self.name, self.shape, lead)


def shapes_remedy(name: str, shape, lead: str = "pass ") -> Remedy:
    """Build input ``name`` for ``shape``: ``shapes=`` in Python (after ``lead``), the key
    ``model.shapes.NAME`` in a config, ``--shapes NAME=AxB`` on the command line."""
    shape = tuple(int(s) for s in shape)
    return Remedy(f"{lead}shapes={{{name!r}: {shape}}}", key=f"model.shapes.{name}", value=str(list(shape)),
                  flag=f"--shapes {name}={'x'.join(map(str, shape))}")


def sizes_remedy(name: str) -> Remedy:
    """Give the sizes of input ``name`` (whose rank is not known either)."""
    return Remedy(f"pass shapes={{{name!r}: (...)}} with its sizes", key=f"model.shapes.{name}", value="[...]",
                  flag=f"--shapes {name}=AxB")


def built_for_pinned(pinned) -> Remedy:
    """For a failure of a model built with sizes chosen for its unknown dimensions
    (:class:`PinnedInput`\\ s): those sizes may be the cause; give the model's own."""
    shown = ", ".join(f"{p.name} {list(p.shape)}" for p in pinned)
    return pinned[0].remedy(f"it was built with sizes chosen for dimensions the model leaves unknown ({shown}): "
                            "give sizes it takes with ")
