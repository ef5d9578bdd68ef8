"""The ``tvm-probe`` command line.

Exit status: 0 when every compared value is within tolerance, 1 when some value diverges,
2 on bad input (a one-line error, never a traceback).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import ProbeError

EXIT_OK, EXIT_DIVERGED, EXIT_BAD_INPUT = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tvm-probe",
        description="Read any intermediate tensor of a TVM-compiled model by its source name.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="probe the built-in demo BERT and compare it with onnxruntime",
                          description="Compile the built-in ONNX BERT with TVM, capture every "
                                      "intermediate, compare each with onnxruntime, write a dump.")
    demo.add_argument("--pipeline", default="fused", help="default | fused (default: fused)")
    demo.add_argument("--layers", type=int, default=2, help="encoder layers (default: 2)")
    demo.add_argument("--dump", type=Path, default=Path("dumps/demo"), help="dump folder (default: dumps/demo)")
    demo.add_argument("--overwrite", action="store_true", help="replace an existing dump folder")
    demo.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (default: 1e-4)")

    ls = sub.add_parser("ls", help="list the source values in a dump")
    ls.add_argument("dump", type=Path)
    ls.add_argument("pattern", nargs="?", default="*", help="glob over names (default: *)")

    get = sub.add_parser("get", help="print or save one value from a dump")
    get.add_argument("dump", type=Path)
    get.add_argument("name")
    get.add_argument("-o", "--output", type=Path, help="save as .npy instead of printing")
    return p


def _cmd_demo(args) -> int:
    import pandas as pd

    from . import demo
    from .compare import compare
    from .probe import Probe
    from .reference.onnxruntime import onnxruntime_values

    model = demo.tiny_bert(num_layers=args.layers)
    inputs = demo.demo_inputs(model)
    print(f"compiling the demo BERT ({args.layers} layers) with the {args.pipeline!r} pipeline ...")
    probe = Probe.from_onnx(model, target="llvm", pipeline=args.pipeline)
    probe.run(inputs)
    result = compare(probe, onnxruntime_values(model, inputs), atol=args.atol)
    served = probe.sources["served"].value_counts()
    print(f"{len(probe.node_infos)} graph nodes; source values by how they are served: "
          + ", ".join(f"{k} {v}" for k, v in served.items()))
    with pd.option_context("display.max_colwidth", 70, "display.width", 160):
        table = result.table()[["name", "served", "max_abs", "cosine", "passed"]]
        print(table.sort_values("max_abs", ascending=False).head(5).to_string(index=False))
    probe.dump(args.dump, overwrite=args.overwrite)
    print(f"dump written to {args.dump}")
    print(result.verdict())
    return EXIT_OK if result else EXIT_DIVERGED


def _cmd_ls(args) -> int:
    import fnmatch

    from .store.dump import load_dump

    table = load_dump(args.dump).sources
    mask = table["name"].map(lambda n: fnmatch.fnmatchcase(n, args.pattern)
                             or fnmatch.fnmatchcase(n, "*/" + args.pattern))
    print(table[mask].to_string(index=False))
    return EXIT_OK


def _cmd_get(args) -> int:
    import numpy as np

    from .store.dump import load_dump

    value = load_dump(args.dump).get(args.name)
    if args.output:
        np.save(args.output, value)
        print(f"{args.name}: {value.dtype}{list(value.shape)} saved to {args.output}")
    else:
        print(np.array2string(value, threshold=200, edgeitems=3))
    return EXIT_OK


def main(argv=None) -> int:
    """Entry point of the ``tvm-probe`` console script."""
    args = _parser().parse_args(argv)
    handler = {"demo": _cmd_demo, "ls": _cmd_ls, "get": _cmd_get}[args.command]
    try:
        return handler(args)
    except ProbeError as err:
        print(f"tvm-probe: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("tvm-probe: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
