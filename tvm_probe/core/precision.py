"""What ``precision=`` / YAML ``precision:`` asks for, checked without TVM (see :mod:`tvm_probe.tools.precision`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ProbeError
from .tolerance import Tolerance, default_tolerance

LOW_DTYPES = {"fp16": "float16", "float16": "float16", "half": "float16", "bf16": "bfloat16",
              "bfloat16": "bfloat16"}
#: What TVM 0.27 does with bf16, in one line (said instead of pretending).
BF16_REFUSED = ("bf16: TVM 0.27 builds bfloat16 kernels on llvm, but its ToMixedPrecision converts to float16 "
                "only (with out_dtype='bfloat16' it fails type inference, e.g. layer_norm 'requires all the input "
                "tensors to have the same dtype'), so tvm_probe has no bf16 build: give precision: fp16, or your "
                "own tvm.transform.Pass that converts to bfloat16")


class PrecisionError(ProbeError):
    """A ``precision=`` value tvm_probe cannot build; the message says what to give instead."""


@dataclass(frozen=True)
class PrecisionSpec:
    """What ``precision=`` asks for.

    Attributes:
        dtype: the low dtype (``"float16"``).
        keep_fp32: source names whose ops stay in fp32.
        pass_: a user ``tvm.transform.Pass`` run instead of ToMixedPrecision (``keep_fp32`` empty).
        accumulate: the accumulator dtype of matmul/conv (ToMixedPrecision's ``out_dtype``).
    """

    dtype: str = "float16"
    keep_fp32: tuple[str, ...] = ()
    pass_: Any = None
    accumulate: str = "float32"

    def describe(self) -> str:
        if self.pass_ is not None:
            return f"pass {getattr(self.pass_.info, 'name', 'custom')}"
        kept = f", keep_fp32 {len(self.keep_fp32)} ops" if self.keep_fp32 else ""
        return f"{self.dtype} (ToMixedPrecision{kept})"


def parse_precision(value) -> PrecisionSpec | None:
    """A :class:`PrecisionSpec` from ``"fp16"``, ``"bf16"``, a ``tvm.transform.Pass`` or
    ``{"dtype": "fp16", "keep_fp32": [names]}``; None for None/``"fp32"``.

    Raises:
        PrecisionError: an unknown dtype or key, or bf16 (see :data:`BF16_REFUSED`).
    """
    if value is None or isinstance(value, PrecisionSpec):
        return value
    if isinstance(value, str):
        value = {"dtype": value}
    if not isinstance(value, dict) and _is_pass(value):  # (TVM is imported only for a non-YAML value)
        return PrecisionSpec(pass_=value)
    if not isinstance(value, dict):
        raise PrecisionError(f"precision {value!r}: give 'fp16', a tvm.transform.Pass or "
                             "{dtype: fp16, keep_fp32: [source names]}")
    unknown = sorted(set(value) - {"dtype", "keep_fp32"})
    if unknown:
        raise PrecisionError(f"precision: unknown key {unknown[0]!r}; valid keys: dtype, keep_fp32")
    dtype = str(value.get("dtype", "fp16")).lower()
    if dtype in ("fp32", "float32", "none"):
        return None
    if dtype not in LOW_DTYPES:
        raise PrecisionError(f"precision dtype {value.get('dtype')!r}: use fp16 (or fp32 for none)")
    if LOW_DTYPES[dtype] == "bfloat16":
        raise PrecisionError(BF16_REFUSED)
    keep = value.get("keep_fp32") or ()
    if isinstance(keep, str) or not all(isinstance(k, str) and k for k in keep):
        raise PrecisionError(f"precision keep_fp32: must be a list of source names, got {keep!r}")
    return PrecisionSpec(dtype=LOW_DTYPES[dtype], keep_fp32=tuple(keep))


def _is_pass(value) -> bool:
    try:
        import tvm
    except ImportError:  # pragma: no cover - TVM is a dependency
        return False
    return isinstance(value, tvm.transform.Pass)




def precision_tolerance(config_reference, atol=None, rtol=None):
    """The tolerance reduced-precision outputs are held to: ``atol``/``rtol`` given, else the
    config's ``reference.atol/rtol``, else float16's default (:func:`tvm_probe.core.tolerance.default_tolerance`)."""

    f16 = default_tolerance("float16")
    pick = lambda *xs: next(x for x in xs if x is not None)
    return Tolerance(pick(atol, getattr(config_reference, "atol", None), f16.atol),
                     pick(rtol, getattr(config_reference, "rtol", None), f16.rtol))
