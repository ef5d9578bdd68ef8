"""The kernel_map stage (see docs/architecture.md)."""
from .mapping import (  # noqa: F401
    VIEW_SYMBOL, ArgKind, ArgSource, PlaceKind, Place, GroupPlan, CallSite, KernelMap, build_kernel_map, helper_symbols, fixed_helper_calls, branch_symbols, SiteOutput, MainCalls, call_sites, BranchCalls, branch_calls, classify,
)
