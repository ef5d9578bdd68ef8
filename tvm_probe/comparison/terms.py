"""The terms of a verdict: what a run was compared with, by which tolerance, over which values.

``tvm-probe run`` writes them into the dump it writes (its metadata, ``verdict_terms``), so that
``compare``, ``view`` and ``report`` on that dump judge it as the run did — and say so — unless
the user gives another tolerance, which the verdict then states beside the recorded one.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..core.errors import ProbeError
from ..core.schema import name_matches
from ..core.tolerance import Tolerance

#: The key of a dump's metadata that holds its :class:`VerdictTerms`.
METADATA_KEY = "verdict_terms"


@dataclass(frozen=True)
class VerdictTerms:
    """How a run's values are judged.

    ``reference`` is a registered reference's name (``onnxruntime``, ``tvm``...) or ``none``;
    ``reference_options`` its arguments (``{target, pipeline}`` of a TVM build);
    ``atol`` / ``rtol`` of None mean the default for each value's dtype; ``tolerances`` are
    per-pattern overrides, first match first; ``selection`` is what the run captured
    (``"all"``, ``"default"`` or source names).
    """

    reference: str
    reference_options: dict = field(default_factory=dict)
    atol: float | None = None
    rtol: float | None = None
    tolerances: tuple[tuple[str, Tolerance], ...] = ()
    selection: str | tuple[str, ...] = "default"

    def tolerance_for(self, names) -> Tolerance | None:
        """The per-pattern tolerance of a value with these names, or None (use the default)."""
        for pattern, tol in self.tolerances:
            if any(name_matches(n, pattern) for n in names):
                return tol
        return None

    def with_tolerance(self, atol: float | None, rtol: float | None) -> VerdictTerms:
        """These terms with ``atol`` / ``rtol`` given by the user in place of the recorded ones
        (per-pattern tolerances give way: the user asked for one tolerance)."""
        return replace(self, atol=atol, rtol=rtol, tolerances=())

    def describe_tolerance(self) -> str:
        """The tolerance in words: ``atol 0, rtol 0``, ``the default by dtype``, plus patterns."""
        if self.atol is None and self.rtol is None:
            words = "the default by dtype"
        else:
            words = ", ".join(f"{k} {v:g}" for k, v in (("atol", self.atol), ("rtol", self.rtol)) if v is not None)
        if self.tolerances:
            words += " and " + ", ".join(f"{p}: {t}" for p, t in self.tolerances)
        return words

    def to_json(self) -> dict:
        """A JSON-friendly dict (what a dump's metadata keeps)."""
        selection = self.selection if isinstance(self.selection, str) else list(self.selection)
        return {"reference": self.reference, "reference_options": dict(self.reference_options),
                "atol": self.atol, "rtol": self.rtol,
                "tolerances": [[p, t.atol, t.rtol] for p, t in self.tolerances], "selection": selection}

    @classmethod
    def from_json(cls, data: dict) -> VerdictTerms:
        """The terms :meth:`to_json` wrote; ProbeError when they are not terms tvm_probe wrote."""
        try:
            selection = data.get("selection", "default")
            return cls(reference=str(data["reference"]), reference_options=dict(data.get("reference_options") or {}),
                       atol=_optional_float(data.get("atol")), rtol=_optional_float(data.get("rtol")),
                       tolerances=tuple((str(p), Tolerance(float(a), float(r))) for p, a, r in data.get("tolerances", ())),
                       selection=selection if isinstance(selection, str) else tuple(selection))
        except (KeyError, TypeError, ValueError) as err:
            raise ProbeError(f"the dump's recorded verdict terms are unreadable ({err!r}): "
                             "give --atol/--rtol, or write the dump again with tvm-probe run") from None


def recorded_terms(reader) -> VerdictTerms | None:
    """The verdict terms a dump records (``tvm-probe run`` writes them), or None."""
    data = reader.metadata.get(METADATA_KEY)
    return None if data is None else VerdictTerms.from_json(data)


def _optional_float(value) -> float | None:
    return None if value is None else float(value)
