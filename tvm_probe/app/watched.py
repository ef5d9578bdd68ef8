"""The console script's watcher: commands that run a model run in a child process it watches.

A TVM kernel that reads out of bounds kills the process running it (SIGSEGV), so ``tvm-probe``
would end with no verdict, no name, nothing said.  The console script forks the process doing a
command that runs a model and waits (:func:`tvm_probe.capture.watch.fork_watched`); the child's
output and exit status pass through unchanged, and a child that died of a signal is said in one
line — the kernel in flight, its call and source ops — with exit status 4::

    tvm-probe: TVM failed: TVM's kernel 'take1' (source op 'gather_node' (Gather)) crashed the
    process with SIGSEGV at kernel call #6

``TVM_PROBE_WATCH=0`` runs every command in its own process.  ``main()`` called in Python is
never watched (the caller's process does the work, as before).
"""
from __future__ import annotations

from ..capture.watch import fork_watched, wanted
from ..core.errors import InternalError, KernelCrash
from ..core.schema import Exit

#: The commands that run a model (TVM's kernels, or a reference's), watched.
WATCHED_COMMANDS = frozenset({"run", "compare", "split", "reduce", "blame", "precision", "quantization"})


def watched_status(argv: list[str], error) -> int | None:
    """The exit status of the watched child that did ``argv``'s work; None in that child, and
    where nothing is watched (another command, ``--help``, ``TVM_PROBE_WATCH=0``, no ``os.fork``):
    this process does the work.  ``error(message, status)`` says a child's death in one line and
    returns its status."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in WATCHED_COMMANDS or {"-h", "--help"} & set(argv) or not wanted():
        return None
    try:
        return fork_watched()
    except KernelCrash as crash:
        return error(f"TVM failed: {crash}", Exit.TVM_FAILED)
    except InternalError as err:  # the instrument itself crashed, copying a kernel's outputs
        return error(f"internal error: {err}", Exit.INTERNAL)
