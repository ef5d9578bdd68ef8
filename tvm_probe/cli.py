"""The ``tvm-probe`` command line.

    tvm-probe run CONFIG [--set KEY=VALUE]...   the main job: probe, dump, compare, report
    tvm-probe ls DUMP [PATTERN]                 list source values in a dump
    tvm-probe get DUMP NAME [-o x.npy]          print or save one value
    tvm-probe compare DUMP                      compare a dump with the reference runtime
    tvm-probe report DUMP -o DIR                tables (CSV, HTML) and graph for a dump
    tvm-probe graph DUMP -o graph.dot|svg       the kernel graph, coloured by error
    tvm-probe split CONFIG                      cut into pipeline stages; write the plan; verify

Exit status: 0 when every compared value is within tolerance, 1 when some value diverges,
2 on bad input (a one-line error, never a traceback), 3 on an internal error (a bug in tvm_probe
or a TVM behaviour it does not know; set TVM_PROBE_TRACEBACK=1 to see the traceback).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .errors import ProbeError, one_line
from .investigate import EXIT_BAD_INPUT, EXIT_DIVERGED, EXIT_OK

EXIT_INTERNAL = 3


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit 2 with one line (argparse's own status is 2 as well)."""

    def error(self, message):
        self.exit(EXIT_BAD_INPUT, f"tvm-probe: error: {message} (see tvm-probe --help)\n")


def _parser() -> argparse.ArgumentParser:
    commands = __doc__.split("\n\n", 1)[1].split("\nExit status")[0]
    p = _Parser(prog="tvm-probe",
                description="Read any intermediate tensor of a TVM-compiled model by its source name.\n\n"
                            + commands,
                epilog="Exit status: 0 all values within tolerance, 1 some value diverges, 2 bad input, "
                       "3 internal error.",
                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quiet", "-q", action="store_true", help="no progress display")
    p.add_argument("--verbose", "-v", action="store_true", help="log what TVM prints while compiling, and more")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", help="run the investigation a YAML config describes (the main job)",
                         description="Import and compile the model, run it once capturing intermediates, "
                                     "write the dump, compare with the reference, write the report.")
    run.add_argument("config", type=Path, help="YAML config (see configs/example.yaml)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a config key, e.g. --set pipeline=fused --set output.overwrite=true")

    ls = sub.add_parser("ls", help="list the source values in a dump")
    ls.add_argument("dump", type=Path)
    ls.add_argument("pattern", nargs="?", default="*", help="glob over names (default: *)")

    get = sub.add_parser("get", help="print or save one value from a dump")
    get.add_argument("dump", type=Path)
    get.add_argument("name", help="node name, tensor name, or a unique '/'-suffix of one")
    get.add_argument("-o", "--output", type=Path, help="save as .npy instead of printing")

    cmp = sub.add_parser("compare", help="compare a dump with onnxruntime on the dumped inputs")
    cmp.add_argument("dump", type=Path)
    cmp.add_argument("--model", type=Path, help="the ONNX model (default: the one the dump records)")
    cmp.add_argument("--atol", type=float, default=1e-4, help="absolute tolerance (default: 1e-4)")
    cmp.add_argument("--rtol", type=float, default=1e-3, help="relative tolerance (default: 1e-3)")
    cmp.add_argument("-o", "--report", type=Path, help="also write the report to this folder")

    rep = sub.add_parser("report", help="write tables (CSV, HTML) and the graph for a dump")
    rep.add_argument("dump", type=Path)
    rep.add_argument("-o", "--output", type=Path, required=True, help="report folder")

    graph = sub.add_parser("graph", help="write the kernel graph of a dump as DOT or SVG")
    graph.add_argument("dump", type=Path)
    graph.add_argument("-o", "--output", type=Path, required=True, help="graph.dot or graph.svg")
    spl = sub.add_parser("split", help="cut the model into pipeline stages (the config's 'split' key), "
                                       "write the plan and verify the chained stages",
                         description="Cut the model where the config's 'split' key says, export every value "
                                     "that crosses a cut, compile each stage, and check that the chained "
                                     "stages reproduce the whole model (max abs difference <= --atol).")
    spl.add_argument("config", type=Path)
    spl.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    spl.add_argument("--atol", type=float, default=1e-5, help="allowed difference (default: 1e-5)")
    return p


def _cmd_split(args, progress) -> int:
    import numpy as np

    from .config import ConfigError, load_config
    from .investigate import config_inputs
    from .split import balance, run_pipeline, split

    config = load_config(args.config, args.overrides)
    if config.split is None:
        raise ConfigError(f"{config.source}: split: missing: add 'split: {{cuts: [...]}}' or 'split: {{balance: N}}'")
    model = config.model.load()
    probe, inputs = config_inputs(config, model, progress)
    cuts = list(config.split.cuts)
    if config.split.balance:
        with progress.stage("balance"):
            cuts, evenness = balance(model, config.split.balance, inputs, config.target, config.pipeline,
                                     probe=probe)
        print(f"proposed cuts after {', '.join(cuts)} (slowest stage / mean = {evenness:.2f})")
    with progress.stage(f"split into {len(cuts) + 1} stages"):
        plan = split(model, cuts, config.target, config.pipeline, dict(config.model.shapes))
    with progress.stage("verify"):
        whole = probe.run(inputs, capture=None)
        chained = run_pipeline(plan, inputs)
        plan.measure(inputs)
    diff = max(float(np.max(np.abs(whole[k].astype(np.float64) - chained[k]))) for k in whole)
    table, stages = plan.table(), plan.stage_table()
    print(stages.to_string(index=False))
    print(f"{len(table)} values cross {len(cuts)} cut(s), {int(table['bytes'].sum())} bytes per inference")
    if config.output.report is not None:
        config.output.report.mkdir(parents=True, exist_ok=True)
        table.to_csv(config.output.report / "split_plan.csv", index=False)
        stages.to_csv(config.output.report / "split_stages.csv", index=False)
        print(f"plan: {config.output.report / 'split_plan.csv'}")
    ok = diff <= args.atol
    print(f"chained stages {'match' if ok else 'DO NOT match'} the whole model: max abs difference {diff:.3g}")
    return EXIT_OK if ok else EXIT_DIVERGED


def _cmd_run(args, progress) -> int:
    from .config import load_config
    from .investigate import investigate

    config = load_config(args.config, args.overrides)
    outcome = investigate(config, progress)
    probe = outcome.probe
    served = probe.sources["served"].value_counts()
    print(f"{len(probe.node_infos)} graph nodes; source values: "
          + ", ".join(f"{k} {v}" for k, v in served.items()))
    if outcome.dump:
        print(f"dump: {outcome.dump}")
    for kind, path in outcome.report.items():
        print(f"{kind}: {path}")
    if outcome.comparison is not None:
        _print_worst(outcome.comparison)
        print(outcome.comparison.verdict())
    return outcome.exit_code


def _print_worst(comparison, n: int = 5) -> None:
    import pandas as pd

    table = comparison.table()
    if table.empty:
        return
    worst = table.sort_values("max_abs", ascending=False).head(n)[["name", "served", "max_abs", "cosine", "passed"]]
    with pd.option_context("display.max_colwidth", 80, "display.width", 200):
        print(worst.to_string(index=False))


def _cmd_ls(args, progress) -> int:
    import fnmatch

    from .store.dump import load_dump

    table = load_dump(args.dump).sources
    keep = table["name"].map(lambda n: fnmatch.fnmatchcase(n, args.pattern)
                             or fnmatch.fnmatchcase(n, "*/" + args.pattern))
    if not keep.any():
        raise ProbeError(f"pattern {args.pattern!r} matches no source value in {args.dump}")
    print(table[keep].to_string(index=False))
    return EXIT_OK


def _cmd_get(args, progress) -> int:
    import numpy as np

    from .store.dump import load_dump

    value = load_dump(args.dump).get(args.name)
    if args.output:
        np.save(args.output, value)
        print(f"{args.name}: {value.dtype}{list(value.shape)} saved to {args.output}")
    else:
        print(np.array2string(value, threshold=200, edgeitems=3))
    return EXIT_OK


def compare_dump(reader, model_path=None, atol=1e-4, rtol=1e-3, progress=None):
    """Compare a dump with onnxruntime run on the dump's own inputs (the model must be the dumped one)."""
    from .compare import compare
    from .config import ModelSpec
    from .importer.onnx import load_onnx, model_hash
    from .reference.onnxruntime import onnxruntime_values

    described = reader.metadata.get("model")
    if model_path is not None:
        model = load_onnx(model_path)
    elif described:
        model = ModelSpec(onnx=Path(described["onnx"]) if "onnx" in described else None,
                          demo=described.get("demo")).load()
    else:
        raise ProbeError("this dump does not record its model: give it with --model PATH")
    if reader.model_hash and model_hash(model) != reader.model_hash:
        raise ProbeError("the model differs from the one the dump was made with (hash mismatch): "
                         "give the original with --model PATH")
    reference = onnxruntime_values(model, reader.inputs)
    return compare(reader, reference, atol=atol, rtol=rtol, progress=progress)


def _cmd_compare(args, progress) -> int:
    from .store.dump import load_dump

    reader = load_dump(args.dump)
    with progress.stage("compare") as stage:
        comparison = compare_dump(reader, args.model, args.atol, args.rtol, stage.update)
    if args.report:
        from .report import write_report

        for kind, path in write_report(args.report, reader, comparison).items():
            print(f"{kind}: {path}")
    _print_worst(comparison)
    print(comparison.verdict())
    return EXIT_OK if comparison else EXIT_DIVERGED


def _cmd_report(args, progress) -> int:
    from .report import write_report
    from .store.dump import load_dump

    for kind, path in write_report(args.output, load_dump(args.dump)).items():
        print(f"{kind}: {path}")
    return EXIT_OK


def _cmd_graph(args, progress) -> int:
    from .report import render_svg, to_dot
    from .store.dump import load_dump

    dot = to_dot(load_dump(args.dump))
    if args.output.suffix == ".svg":
        svg = render_svg(dot)
        if svg is None:
            raise ProbeError("writing SVG needs Graphviz's 'dot' program: install graphviz or write a .dot file")
        args.output.write_text(svg, encoding="utf-8")
    elif args.output.suffix == ".dot":
        args.output.write_text(dot, encoding="utf-8")
    else:
        raise ProbeError(f"cannot write a graph as {args.output.suffix or 'a file without suffix'}: "
                         "use a .dot or .svg file name")
    print(f"graph: {args.output}")
    return EXIT_OK


_COMMANDS = {"run": _cmd_run, "ls": _cmd_ls, "get": _cmd_get, "compare": _cmd_compare,
             "report": _cmd_report, "graph": _cmd_graph, "split": _cmd_split}


def main(argv=None) -> int:
    """Entry point of the ``tvm-probe`` console script."""
    from .progress import Progress

    args = _parser().parse_args(argv)
    if args.verbose:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    progress = Progress(enabled=False if args.quiet else None)
    try:
        return _COMMANDS[args.command](args, progress)
    except ProbeError as err:
        print(f"tvm-probe: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:  # dumps and reports are written atomically: nothing half-written remains
        print("tvm-probe: error: interrupted (no partial dump or report is left behind)", file=sys.stderr)
        return EXIT_BAD_INPUT
    except BrokenPipeError:  # `tvm-probe get ... | head`
        return EXIT_OK
    except Exception as err:  # a bug: keep it apart from divergence (1) and bad input (2)
        if os.environ.get("TVM_PROBE_TRACEBACK"):
            raise
        print(f"tvm-probe: internal error: {type(err).__name__}: {one_line(err)} (a bug in tvm_probe "
              "or an unsupported TVM behaviour; set TVM_PROBE_TRACEBACK=1 for the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


if __name__ == "__main__":
    sys.exit(main())
