"""What the kernel map is made of: call sites, their arguments, places of source values, group plans."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any

VIEW_SYMBOL = "vm.builtin.reshape"
_KERNEL_OPS = {"relax.call_tir", "relax.call_dps_packed"}
#: Calls of a packed function that returns its result (``R.call_pure_packed("relax.run.nonzero",
#: x)``): data-dependent ops (NonZero, Unique, masked_select...) lower to them.
PACKED_OPS = {"relax.call_pure_packed", "relax.call_packed"}


class ArgKind(str, Enum):
    """Where the value of one kernel argument comes from."""

    NODE = "node"            # an output of an earlier kernel call
    INPUT = "input"          # a model input
    CONST = "const"          # a constant of the module (a weight, a folded value)
    UNTRACKED = "untracked"  # anything else; copied before the call when it is needed


@dataclass(frozen=True)
class ArgSource:
    """One kernel argument: ``kind`` and, by kind, ``node``/``output``, ``input_index`` or ``const``;
    an untracked element of a tuple parameter (a weight of MLC's packed parameters) also says
    which: ``param_item`` = (the parameter's position, the element's index)."""

    kind: ArgKind
    node: int = -1
    output: int = 0
    input_index: int = -1
    const: Any = None
    param_item: tuple | None = None


class PlaceKind(str, Enum):
    """How the compiled module holds a value."""

    INPUT = "input"        # a model input (or an identity of one)
    OUTPUT = "output"      # an output of a kernel call (or of a reshape view)
    INTERIOR = "interior"  # a tensor a fused kernel computes and keeps inside
    CONSTANT = "constant"  # a constant of the compiled module (folded by the pipeline)
    FOLDED = "folded"      # folded away by FoldConstant; re-evaluated from the module before it
    SHAPE = "shape"        # a symbolic dimension: a size of a model input (``output`` is the axis)
    DIMS = "dims"          # a shape or scalar value built from input sizes (``inner``: formulas,
                           # see kernel_map.shape_values; ``output`` 1 for a scalar)
    ARGUMENT = "argument"  # a value no kernel outputs but one reads (an If's result): input
                           # ``output`` of call site ``site``, copied before that call
    RETURNED = "returned"  # a value no kernel outputs that the model returns (an If's result):
                           # model output ``output``, as the VM returned it


@dataclass(frozen=True)
class Place:
    """Where one value lives at run time.

    Attributes:
        kind: see :class:`PlaceKind`.
        site: the call site (OUTPUT, INTERIOR).
        output: which output of the site (OUTPUT).
        input_index: which model input (INPUT).
        inner: the binding Var inside the site's grouped function (INTERIOR).
        const: the Relax constant (CONSTANT).
        var: the Var of the module before FoldConstant that computes it (FOLDED).
    """

    kind: PlaceKind
    site: int = -1
    output: int = 0
    input_index: int = -1
    inner: Any = None
    const: Any = None
    var: Any = None


@dataclass
class GroupPlan:
    """How to recompute the tensors a fused call site keeps inside.

    Attributes:
        function: the grouped Relax function (post-fusion) this site calls.
        name: its global name (cut modules are cached per name).
        param_args: per function parameter, the position of the site argument that feeds it,
            or ``None`` when it is a constant (then ``param_consts`` has it).
        prim_funcs: GlobalVar → PrimFunc for every kernel the function calls.
        param_symbols: symbolic dimension (TIR Var) in ``param_consts`` → ``(input, axis)``,
            the model input axis whose size it is (a decode step's past length), so a run's
            input shapes give its value.
    """

    function: Any
    name: str
    param_args: list[int | None]
    param_consts: dict[int, Any] = field(default_factory=dict)
    prim_funcs: dict = field(default_factory=dict)
    param_symbols: dict = field(default_factory=dict)


@dataclass
class CallSite:
    """One kernel call of ``main`` (a graph node of the dump)."""

    index: int
    symbol: str
    occurrence: int
    is_view: bool
    args: list[ArgSource]
    out_shapes: list[tuple[int, ...]]
    out_dtypes: list[str]
    output_keys: list[list[str]] = field(default_factory=list)
    interior_keys: list[str] = field(default_factory=list)
    group: GroupPlan | None = None
    call_args: list = field(default_factory=list, repr=False)  # the Relax arguments of the call
    #: a packed function that returns its result (``relax.run.nonzero``): no destination
    #: arguments; its outputs are what the call returned, whatever their run-time size
    packed: bool = False

    @property
    def returns_output(self) -> bool:
        """Whether the call returns its outputs (a view, a packed function) instead of writing
        them into destination arguments (a kernel)."""
        return self.is_view or self.packed

    @property
    def num_inputs(self) -> int:
        return len(self.args)

    @property
    def num_outputs(self) -> int:
        return len(self.out_shapes)


@dataclass
class BranchCalls:
    """The kernel calls ``main`` makes inside ``If`` branches, for matching calls to call sites.

    Attributes:
        occurrences: symbol → the occurrences of its calls that run inside an If branch, where
            both branches call it equally often (so every later call keeps its occurrence).
            They match no call site: a branch call belongs to whichever branch ran.
        open_symbols: kernels an If's branches call unequally often: which of their calls comes
            after the If depends on the branch, so calls of them after the first such If match
            no call site (the instrument ignores them; what they compute is unknown, with why).
        skipped: Vars of ``main`` bound to such calls, by symbol.
    """

    occurrences: dict[str, list[int]] = field(default_factory=dict)
    open_symbols: set[str] = field(default_factory=set)
    skipped: dict = field(default_factory=dict)


@dataclass
class KernelMap:
    """Every call site in execution order, and where each source value is.

    Attributes:
        sites: the kernel calls of one run, in order.
        places: source key → :class:`Place`, for every value the compiled module holds.
        lost: source key → why it has no place (for tagged values that could not be followed).
        known_limits: the keys of ``lost`` whose reason is a known limit of tvm_probe (values an
            If decides; the destination of an in-place op, ``y`` of ``y.copy_(w)``, which the
            import reads nowhere before the write), not a surprise to report.
        helper_symbols: kernels the VM calls that passes after the call graph added (the shape
            functions of symbolic shapes), and kernels called only inside If branches; they
            compute no source value tvm_probe serves.
        branches: calls inside If branches that match no call site (see :class:`BranchCalls`).
        fixed_helpers: helper symbol → how many times every run calls it, when the final
            ``main`` calls each helper a fixed number of times (no If, e.g. the
            ``compute_symbolic_expr`` lowering makes for a ``T.float64`` argument); empty otherwise.
    """

    sites: list[CallSite]
    places: dict[str, Place] = field(default_factory=dict)
    lost: dict[str, str] = field(default_factory=dict)
    known_limits: set[str] = field(default_factory=set)
    helper_symbols: frozenset[str] = frozenset()  # kernels lowering added (shape functions): no source values
    branches: BranchCalls | None = None  # kernel calls inside If branches (None: no If)
    fixed_helpers: dict[str, int] = field(default_factory=dict)

    def site_of(self, key: str) -> int | None:
        """The call site whose output or interior holds ``key`` (None for other places)."""
        place = self.places.get(key)
        return place.site if place is not None and place.kind in (PlaceKind.OUTPUT, PlaceKind.INTERIOR) else None
