"""The kernel map: every source value's place in the compiled module, per kernel call site.

:mod:`.types` (what a map is made of), :mod:`.sites` (the call sites of ``main``),
:mod:`.mapping` (following source values to their places; ``classify``), :mod:`.valuenum`
(value numbering), :mod:`.relax_analysis` (analyses of Relax functions other stages share).
"""
from .mapping import build_kernel_map, classify  # noqa: F401
from .sites import (  # noqa: F401
    BranchCalls,
    MainCalls,
    SiteOutput,
    branch_calls,
    branch_symbols,
    call_sites,
    fixed_helper_calls,
    helper_symbols,
    subroutines,
)
from .types import VIEW_SYMBOL, ArgKind, ArgSource, CallSite, GroupPlan, KernelMap, Place, PlaceKind  # noqa: F401
