"""The ``tvm-probe`` command line: parses arguments, calls one function, prints its result.

    tvm-probe run CONFIG|MODEL_FILE [--shapes X=AxB] [--inputs F.npz] [--write-config F]   the main job:
                                                probe, dump, compare, report (a .onnx/.tflite/.pt2 file needs no config)
    tvm-probe ls DUMP [PATTERN] [--op TYPE]     list source values in a dump (any of their names; by op type)
    tvm-probe get DUMP NAME [-o x.npy]          print or save one value
    tvm-probe compare DUMP                      compare a dump with the reference of its model
    tvm-probe diff DUMP_A DUMP_B                compare two runs of one model (builds, targets, versions)
    tvm-probe report DUMP -o DIR                tables (CSV, HTML) and graph for a dump
    tvm-probe graph DUMP -o graph.dot|svg       the kernel graph, coloured by error
    tvm-probe split CONFIG                      cut into pipeline stages; write the plan; verify
    tvm-probe reduce CONFIG -o DIR              smallest sub-model that still fails: a TVM bug report
    tvm-probe blame CONFIG -o DIR               whose bug: the importer, a named pass (a TVMScript repro), the kernel
    tvm-probe serve [--host H] [--port P] [--tracker HOST:PORT --key K]   a TVM RPC server probes can use
    tvm-probe view DUMP [--port P] [--no-browser] [--export DIR]   Model Explorer: source graph + kernels, errors on them
    tvm-probe precision CONFIG -o DIR           which ops must stay in fp32 for an fp16 build: DIR/precision.yaml
    tvm-probe quantization FLOAT QUANTIZED [--inputs F] [--shapes X=AxB] [--target-sqnr DB]   int8 ops that hurt

Global options (-q, -v) go before or after the command.  The work itself lives in
:mod:`tvm_probe.app.investigate` and the stage modules; the exit statuses in
:class:`tvm_probe.core.schema.Exit`.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import sys
from pathlib import Path

import numpy as np

from .. import __version__
from ..capture.remote import Server
from ..capture.watch import TRACEBACK_ENV
from ..comparison.dump import compare_dump
from ..comparison.reference import is_no_reference
from ..comparison.terms import recorded_terms
from ..comparison.verdict import compare
from ..core.errors import ProbeError, Terms, TVMError, UnknownNameError, one_line
from ..core.native_log import native_log_to_logging, release_native
from ..core.schema import DEFAULT_PIPELINE, DEFAULT_TARGET, EXIT_HELP, PIPELINE_NAMES, PIPELINES, Exit
from ..core.sources import Kind
from ..core.tolerance import default_tolerance
from ..importer.onnx import load_onnx
from ..llm import GenerationOutcome
from ..show.report import write_graph, write_report
from ..show.view import export, model_explorer, reference_comparison, view
from ..store.dump import load_dump
from .config import ConfigError, load_config
from .model_file import config_for_model, write_config
from .overrides import RUN_FLAGS, run_overrides, run_terms, shapes_flags
from .investigate import (
    QuantizationOutcome,
    blame_investigation,
    investigate,
    model_inputs,
    precision_investigation,
    quantization_investigation,
    reduce_investigation,
    split_investigation,
)
from .progress import Progress
from .watched import watched_status


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit 2 with one line (argparse's own status is 2 as well)."""

    def error(self, message):
        self.exit(Exit.BAD_INPUT, f"tvm-probe: error: {message} (see tvm-probe --help)\n")


DUMP_HELP = "a dump folder (tvm-probe run's output.dump, or one TVM's old debug executor wrote)"


def _global_options(parser, default, verbose: bool = True) -> None:
    """-q, and -v where the command builds or runs a model with TVM (the others print no log)."""
    parser.add_argument("--quiet", "-q", action="store_true", default=default, help="no progress display")
    if verbose:
        parser.add_argument("--verbose", "-v", action="store_true", default=default,
                            help="log what TVM prints while compiling, and more")


def _tvm_version() -> str:
    """The installed apache-tvm's version, read from its metadata (importing TVM takes a second)."""
    from importlib import metadata

    try:
        return metadata.version("apache-tvm")
    except metadata.PackageNotFoundError:
        return "not installed"


def _parser() -> argparse.ArgumentParser:
    commands = __doc__.split("\n\n", 1)[1].split("\nGlobal options")[0]
    # the commands are listed once, with their arguments (argparse's own list, suppressed, repeated them)
    p = _Parser(prog="tvm-probe", usage="tvm-probe [-h] [--quiet] [--verbose] [--version] COMMAND ...",
                description="Read any intermediate tensor of a TVM-compiled model by its source name.\n\n"
                            "commands (tvm-probe COMMAND --help for each):\n" + commands,
                epilog=EXIT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    _global_options(p, False)
    p.add_argument("--version", action="version", version=f"tvm-probe {__version__} (apache-tvm {_tvm_version()})")
    with_tvm, reading = argparse.ArgumentParser(add_help=False), argparse.ArgumentParser(add_help=False)
    _global_options(with_tvm, argparse.SUPPRESS)  # after the command too, without resetting the top level
    _global_options(reading, argparse.SUPPRESS, verbose=False)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_Parser,
                           help=argparse.SUPPRESS)

    def command(name, tvm: bool = True, **kw):
        """A command's parser; ``tvm=False`` for those that only read a dump (no -v)."""
        return sub.add_parser(name, prog=f"tvm-probe {name}", parents=[with_tvm if tvm else reading], **kw)

    run = command("run", help="run the investigation a YAML config describes, or on a model file (the main job)",
                  description="Import and compile the model, run it once capturing intermediates, write the "
                              "dump, compare with the reference, write the report.  A model file (.onnx, "
                              ".tflite, a torch.export.save program .pt2) needs no config: random inputs from the "
                              "model's own types (a .pt2: its example inputs), the kind's reference (onnxruntime, "
                              "TFLite, PyTorch), output under ./tvm_probe_out/<model name>/.",
                  epilog=EXIT_HELP)
    _config_arguments(run, "a YAML config (see configs/example.yaml) or a model file (.onnx, .tflite, .pt2)")
    run.add_argument("--shapes", action="append", default=[], metavar="NAME=AxB",
                     help="sizes for an input with unknown dimensions, e.g. --shapes input_ids=1x128 (repeat per "
                          "input; the key model.shapes; default: as TVM imports it, else 1 or the --inputs sizes)")
    run.add_argument("--inputs", type=Path, metavar="FILE.npz",
                     help="the inputs: an .npz of arrays named as the model's inputs (the key inputs; default "
                          "for a model file: random, from each input's type)")
    run.add_argument("--pipeline", choices=PIPELINE_NAMES, help=f"TVM pipeline (the key pipeline; default: "
                                                                 f"{DEFAULT_PIPELINE})")
    run.add_argument("--target", help=f"TVM target (the key target; default: {DEFAULT_TARGET})")
    run.add_argument("--write-config", type=Path, metavar="FILE",
                     help="with a model file: also write the YAML config this run stands for, to edit and run")
    run.add_argument("--verify", action="store_true",
                     help="also check every served value against an independent unfused build (exit 3 "
                          "if one differs: a tvm_probe problem)")

    ls = command("ls", tvm=False, help="list the source values in a dump")
    ls.add_argument("dump", type=Path, help=DUMP_HELP)
    ls.add_argument("pattern", nargs="?", default="*",
                    help="glob over every name of a value: node, tensor, module path (default: *)")
    ls.add_argument("--op", metavar="TYPE",
                    help="only values made by an op of this type (as Netron shows it: MatMul, Einsum; any case)")
    ls.add_argument("--kind", action="append", choices=[k.value for k in LS_ORDER], metavar="KIND",
                    help=f"only values of this kind ({', '.join(k.value for k in LS_ORDER)}; repeat for several)")

    get = command("get", tvm=False, help="print or save one value from a dump")
    get.add_argument("dump", type=Path, help=DUMP_HELP)
    get.add_argument("name", help="node name, tensor name, module path, or a unique '/'-suffix of one")
    get.add_argument("-o", "--npy", "--output", dest="output", type=Path, metavar="FILE",
                     help="save as .npy instead of printing")

    cmp = command("compare", help="compare a dump with the reference of its model on the dumped inputs",
                  epilog=EXIT_HELP)
    cmp.add_argument("dump", type=Path, help=DUMP_HELP)
    cmp.add_argument("--model", type=Path, help="the ONNX model (default: the one the dump records)")
    _tolerance_arguments(cmp, recorded=True)
    cmp.add_argument("-o", "--report", type=Path, help="also write the report to this folder")

    diff = command("diff", tvm=False,
                   help="compare two dumps of one source model by source name (DUMP_B is the reference)",
                   description="Line up two runs of the same source model by source name, whatever their "
                               "kernels (two pipelines, targets, dtypes, TVM versions), and compare them as "
                               "'compare' does, DUMP_B being the reference.", epilog=EXIT_HELP)
    diff.add_argument("dump", type=Path, help="DUMP_A: the run under test")
    diff.add_argument("reference", type=Path, help="DUMP_B: the reference run")
    _tolerance_arguments(diff)
    diff.add_argument("-o", "--report", type=Path, help="also write the report (of DUMP_A) to this folder")

    rep = command("report", tvm=False, help="write tables (CSV, HTML) and the graph for a dump")
    rep.add_argument("dump", type=Path, help=DUMP_HELP)
    rep.add_argument("-o", "--output", type=Path, required=True, help="report folder")
    _tolerance_arguments(rep, recorded=True)

    graph = command("graph", tvm=False, help="write the kernel graph of a dump as DOT or SVG")
    graph.add_argument("dump", type=Path, help=DUMP_HELP)
    graph.add_argument("-o", "--output", type=Path, required=True, help="graph.dot or graph.svg")

    spl = command("split", help="cut the model into pipeline stages (the config's 'split' key), write the plan "
                                "and verify the chained stages",
                  description="Cut the model where the config's 'split' key says, export every value that "
                              "crosses a cut, compile each stage, and check that the chained stages reproduce "
                              "the whole model (within the tolerance, as 'compare' judges).")
    _config_arguments(spl)
    _tolerance_arguments(spl)
    red = command("reduce", help="reduce a model TVM gets wrong to the smallest sub-model that still fails, "
                                 "written as a standalone reproduction for a TVM bug report",
                  description="Find the smallest ONNX sub-model on which the config's TVM build still diverges "
                              "from the reference (or fails to compile) the same way, and write DIR: model.onnx, "
                              "inputs.npz, expected.npz, repro.py (tvm + onnxruntime + numpy only), README.md.")
    _config_arguments(red)
    red.add_argument("-o", "--output", type=Path, required=True, help="the reproduction folder")
    red.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    red.add_argument("--exact", action="store_true",
                     help="count differences within a few ulps of the values' magnitude too (by default they "
                          "are floating-point rounding, not a TVM bug)")
    bla = command("blame", help="say which stage of TVM is responsible for a failure or a wrong value: the "
                                "importer, a named pass of the pipeline, or the op's kernel",
                  description="Import, compile and run the config's model against its reference; for a failure or "
                              "the first divergent value, find the stage responsible (a pass by bisection over the "
                              "pipeline's passes) and, where a pass is blamed, write DIR: repro.py (the module "
                              "before the pass as TVMScript and the pass; tvm and numpy only), params.npz, README.md.")
    _config_arguments(bla)
    bla.add_argument("-o", "--output", type=Path, required=True, help="the reproduction folder")
    bla.add_argument("--overwrite", action="store_true", help="replace an existing folder")
    srv = command("serve", help="run a TVM RPC server whose sessions tvm_probe can instrument (on the device)",
                  description="Serve TVM RPC sessions that load tvm_probe's native instrument, so that a probe on "
                              "another machine (remote={host, port} or {tracker, key}) can run its executable here "
                              "and bring every captured tensor back.  Stop it with Ctrl-C.")
    srv.add_argument("--host", default="0.0.0.0", help="address to listen on (default: 0.0.0.0, every interface)")
    srv.add_argument("--port", type=int, default=9190, help="port to listen on; 0 picks a free one (default: 9190)")
    srv.add_argument("--tracker", metavar="HOST:PORT", help="register with this TVM RPC tracker (needs --key)")
    srv.add_argument("--key", default="", help="the device key clients ask the tracker for")
    srv.add_argument("--custom-addr", help="the address to report to the tracker (default: the one it sees)")
    _view_arguments(command)
    _precision_arguments(command)
    _quantization_arguments(command)
    return p


def _tolerance_arguments(parser, recorded: bool = False) -> None:
    f32 = default_tolerance("float32")
    where = "the dump's recorded tolerance, else " if recorded else ""
    parser.add_argument("--atol", type=float, help=f"absolute tolerance (default: {where}by dtype, "
                                                   f"{f32.atol:g} for float32)")
    parser.add_argument("--rtol", type=float, help=f"relative tolerance (default: {where}by dtype, "
                                                   f"{f32.rtol:g} for float32)")


def _config_arguments(parser, what: str = "YAML config (see configs/example.yaml)") -> None:
    parser.add_argument("config", type=Path, help=what)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config key, e.g. --set pipeline=fused --set output.overwrite=true")


# -- commands: each calls one function and prints ------------------------------------------------
def _cmd_run(args, progress) -> int:
    overrides = run_overrides(args)
    if args.config.suffix.lower() in (".yaml", ".yml") or args.config.is_dir():
        if args.write_config is not None:
            raise ConfigError("--write-config goes with a model file: a config is a file already (edit it)")
        config = load_config(args.config, overrides)
    else:
        config, data = config_for_model(args.config, overrides)
        if args.write_config is not None:
            written = write_config(data, args.write_config, "tvm-probe " + " ".join(sys.argv[1:] or ["run"]))
            print(f"config: {written}")
    args.terms = run_terms(config)
    outcome = investigate(config, progress)
    if isinstance(outcome, (GenerationOutcome, QuantizationOutcome)):  # per step / per quantized op
        for line in outcome.lines():
            print(line)
        return outcome.exit_code
    probe = outcome.probe
    served = probe.sources["served"].value_counts()
    print(f"{len(probe.node_infos)} graph nodes; source values: " + ", ".join(f"{k} {v}" for k, v in served.items()))
    for line in _build_notes(probe, outcome.report.get("html"), args.verbose):
        print(line)
    if outcome.dump:
        print(f"dump: {outcome.dump}")
    for kind, path in outcome.report.items():
        print(f"{kind}: {path}")
    if outcome.comparison is not None:
        _print_worst(outcome.comparison)
        print(outcome.comparison.verdict())
    if outcome.verification is not None:
        print(outcome.verification.summary())
    return outcome.exit_code


def _build_notes(probe, page, verbose: bool) -> list[str]:
    """``probe.findings()``: a line per import fix the model needed (tvm_probe changed what TVM
    imports), then per compile warning — those with -v only, else one line saying where they are."""
    lines, warned = probe.findings(), len(probe.compile_warnings)
    if verbose or not warned:
        return lines
    where = f"see Build notes in {page}" if page is not None else "tvm-probe run -v shows them"
    return lines[:-warned] + [f"TVM printed {warned} warning{'s' if warned != 1 else ''} while compiling: {where}"]


def _print_worst(comparison, n: int = 5) -> None:
    """The ``n`` values with the largest errors, under a title that says what they are."""
    import pandas as pd

    table = comparison.table()
    table = table[table["status"] != "dead code"]
    if table.empty:
        return
    worst = table.sort_values("max_abs", ascending=False, na_position="first").head(n)
    if (worst["max_abs"].fillna(1) == 0).all():
        title = f"no difference in any of {len(table)} compared values; the first {len(worst)}:"
    else:
        title = f"largest {len(worst)} errors of {len(table)} compared values:"
    with pd.option_context("display.max_colwidth", 80, "display.width", 200):
        print(title)
        print(worst[["name", "served", "status", "max_abs", "cosine", "note"]].to_string(index=False))


#: ``ls`` lists what the run computed first, weights last.
LS_ORDER = (Kind.VALUE, Kind.INPUT, Kind.CONSTANT, Kind.PARAM)


def _cmd_ls(args, progress) -> int:
    try:
        found = load_dump(args.dump).find(args.pattern, op=args.op)
    except UnknownNameError as err:
        raise err.listed_by(f"list names with: tvm-probe ls {args.dump}") from None
    if args.kind:
        found = found[found["kind"].isin(args.kind)]
    rank = {kind.value: i for i, kind in enumerate(LS_ORDER)}
    found = found.iloc[np.argsort([rank.get(k, len(rank)) for k in found["kind"]], kind="stable")]
    shown = ["name", "op_type", "kind", "served", "shape", "dtype"]
    if (found["tensor"] != found["name"]).any():  # another spelling of some value: keep its key
        shown.insert(1, "tensor")
    print(_left_aligned(found[shown]) if len(found) else "no value of these kinds matches")
    return Exit.OK


def _left_aligned(table) -> str:
    """A table as text, every column left-aligned (names read from their start)."""
    cells = [list(table.columns)] + [[str(v) for v in row] for row in table.itertuples(index=False)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(table.columns))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in cells)


def _cmd_get(args, progress) -> int:
    reader = load_dump(args.dump)
    try:
        value = reader.get(args.name)
    except UnknownNameError as err:
        raise err.listed_by(f"list names with: tvm-probe ls {args.dump}") from None
    print(_value_header(reader, args.name, value))
    if args.output:
        np.save(args.output, value)
        print(f"saved to {args.output}")
    else:
        print(np.array2string(value, threshold=200, edgeitems=3))
    return Exit.OK


def _value_header(reader, name: str, value) -> str:
    """``NAME: float32 [1, 8, 32], served: captured`` (the source key too, where the name was
    another spelling of it)."""
    key = reader.resolve(name)
    serving = reader.servings.get(key)
    served = f", served: {serving.served.value}" if serving is not None else ""
    named = name if key == name else f"{name} ({key})"
    return f"{named}: {value.dtype} {list(value.shape)}{served}"


def _cmd_compare(args, progress) -> int:
    reader = load_dump(args.dump)
    with progress.stage("compare") as stage:
        comparison = compare_dump(reader, args.model, args.atol, args.rtol, stage.update)
    return _print_comparison(args, reader, comparison)


def _cmd_diff(args, progress) -> int:
    reader = load_dump(args.dump)
    with progress.stage("diff") as stage:
        comparison = compare(reader, load_dump(args.reference), args.atol, args.rtol,
                             keys=reader.captured_keys, progress=stage.update)
    return _print_comparison(args, reader, comparison)


def _print_comparison(args, reader, comparison) -> int:
    if args.report:
        for kind, path in write_report(args.report, reader, comparison).items():
            print(f"{kind}: {path}")
    _print_worst(comparison)
    print(comparison.verdict())
    return Exit.OK if comparison else Exit.DIVERGED


def _cmd_report(args, progress) -> int:
    reader = load_dump(args.dump)
    comparison = _recorded_verdict(reader, args, progress)
    for kind, path in write_report(args.output, reader, comparison).items():
        print(f"{kind}: {path}")
    if comparison is not None:
        print(comparison.verdict())
    return Exit.OK


def _recorded_verdict(reader, args, progress):
    """The dump judged as its run was (its recorded verdict terms, or --atol/--rtol), for its
    report; None, saying why, when the run compared with nothing or the model is not found."""
    terms = recorded_terms(reader)
    asked = args.atol is not None or args.rtol is not None
    if not asked and (terms is None or is_no_reference(terms.reference)):
        return None
    try:
        with progress.stage("compare") as stage:
            return compare_dump(reader, None, args.atol, args.rtol, stage.update)
    except ProbeError as err:
        print(f"the report has no verdict: {err}")
        return None


def _cmd_graph(args, progress) -> int:
    print(f"graph: {write_graph(load_dump(args.dump), args.output)}")
    return Exit.OK


def _cmd_split(args, progress) -> int:
    config = load_config(args.config, args.overrides)
    outcome = split_investigation(config, args.atol, args.rtol, progress)
    if outcome.evenness is not None:
        print(f"proposed cuts after {', '.join(outcome.cuts)} (slowest stage / mean = {outcome.evenness:.2f})")
    table, stages = outcome.plan.table(), outcome.plan.stage_table()
    print(stages.to_string(index=False))
    print(f"{len(table)} values cross {len(outcome.cuts)} cut(s), {int(table['bytes'].sum())} bytes per inference")
    if config.output.report is not None:
        config.output.report.mkdir(parents=True, exist_ok=True)
        table.to_csv(config.output.report / "split_plan.csv", index=False)
        stages.to_csv(config.output.report / "split_stages.csv", index=False)
        print(f"plan: {config.output.report / 'split_plan.csv'}")
    verb = "match" if outcome.exit_code == Exit.OK else "DO NOT match"
    print(f"chained stages {verb} the whole model: max abs difference {outcome.max_difference:.3g} "
          f"({outcome.tolerance_rule})")
    return outcome.exit_code


def _cmd_reduce(args, progress) -> int:
    result = reduce_investigation(load_config(args.config, args.overrides), args.output, args.overwrite, progress,
                                  exact=args.exact)
    print(result.summary())
    print(f"reproduction: {args.output}")
    return Exit.OK


def _cmd_blame(args, progress) -> int:
    found, written = blame_investigation(load_config(args.config, args.overrides), args.output, args.overwrite,
                                         progress)
    print(found)
    why_not = getattr(found.repro, "why_not", "")
    if written is not None:
        print(f"reproduction: {written}")
    elif why_not:
        print(f"no reproduction: {why_not}")
    return {"none": Exit.OK, "divergence": Exit.DIVERGED}.get(found.failure or "none", Exit.TVM_FAILED)


def _cmd_serve(args, progress) -> int:
    logging.getLogger("RPCServer").setLevel(logging.WARNING if args.quiet else logging.INFO)  # TVM's server log
    server = Server(args.host, args.port, tracker=args.tracker, key=args.key, custom_addr=args.custom_addr)
    print(f"tvm-probe serve: listening on {server.describe()} (Ctrl-C to stop)", flush=True)
    server.serve_forever()
    return Exit.OK


# -- tvm-probe view (tvm_probe/show/view.py) ----------------------------------------------------------
def _view_arguments(command) -> None:
    view = command("view", tvm=False,
                   help="look at a dump in Google's Model Explorer: the source graph with each value's error, "
                        "and the kernels TVM fused (needs tvm_probe[view])",
                   description="Serve Model Explorer on localhost with the source model the dump records (its "
                               "errors against the reference, how each value is served, the kernel computing it "
                               "and its time, as per-node overlays) and a graph of the compiled module, each fused "
                               "kernel call a group holding its source ops.  --export writes the same as Model "
                               "Explorer JSON files instead.")
    view.add_argument("dump", type=Path, help=DUMP_HELP)
    view.add_argument("--model", type=Path, help="the source model (default: the one the dump records)")
    view.add_argument("--port", type=int, help="port to serve on (default: the first free one from 8080)")
    view.add_argument("--host", default="localhost", help="address to serve on (default: localhost)")
    view.add_argument("--no-browser", action="store_true", help="do not open the page in a browser")
    view.add_argument("--export", type=Path, metavar="DIR", help="write Model Explorer JSON files to DIR; no server")
    view.add_argument("--overwrite", action="store_true", help="with --export: replace a non-empty DIR")
    _tolerance_arguments(view, recorded=True)


def _cmd_view(args, progress) -> int:
    model_explorer()  # a missing extra is said before any work
    reader = load_dump(args.dump)
    with progress.stage("compare"):
        comparison = reference_comparison(reader, args.model, args.atol, args.rtol)
    if args.export is not None:
        files = export(reader, args.export, comparison, args.model, overwrite=args.overwrite)
        print(f"view files: {files.folder}; to load them by hand:")
        for line in files.commands:
            print(f"  {line}")
        return Exit.OK
    view(reader, comparison, args.model, host=args.host, port=args.port, open_browser=not args.no_browser)
    return Exit.OK


# -- tvm-probe precision (tvm_probe/tools/precision/) ------------------------------------------------
def _precision_arguments(command) -> None:
    prec = command("precision", help="find the ops to keep in fp32 so that an fp16 build meets the tolerance; "
                                     "write DIR/precision.yaml",
                   description="Build the model in fp16 (TVM's ToMixedPrecision), rank its source ops by the error "
                               "each adds by itself, and find a small set to keep in fp32 such that the outputs meet "
                               "the tolerance (default: float16's, against the config's reference, else the fp32 "
                               "build): every candidate is rebuilt and checked.  Writes DIR/precision.yaml (a "
                               "'precision:' key for the config), ranking.csv and precision.html.  Exit 0 when a "
                               "set was found, 1 when even every op in fp32 fails.", epilog=EXIT_HELP)
    _config_arguments(prec)
    prec.add_argument("-o", "--output", type=Path, required=True, help="folder for precision.yaml and the ranking")
    prec.add_argument("--overwrite", action="store_true", help="replace an existing precision.yaml")
    prec.add_argument("--atol", type=float, help="absolute tolerance of the outputs (default: float16's, 5e-3)")
    prec.add_argument("--rtol", type=float, help="relative tolerance of the outputs (default: float16's, 5e-3)")


def _cmd_precision(args, progress) -> int:
    outcome = precision_investigation(load_config(args.config, args.overrides), args.output, args.atol, args.rtol,
                                      args.overwrite, progress)
    for line in outcome.search.lines():
        print(line)
    for kind, path in outcome.files.items():
        print(f"{kind}: {path}")
    return outcome.exit_code


_COMMANDS = {"run": _cmd_run, "reduce": _cmd_reduce, "blame": _cmd_blame, "ls": _cmd_ls, "get": _cmd_get, "compare": _cmd_compare, "diff": _cmd_diff,
             "report": _cmd_report, "graph": _cmd_graph, "split": _cmd_split, "serve": _cmd_serve, "view": _cmd_view}


_COMMANDS["precision"] = _cmd_precision


# -- tvm-probe quantization (tvm_probe/tools/quantization/) ---------------------------------------
def _quantization_arguments(command) -> None:
    quant = command("quantization", help="rank the ops of an ONNX QDQ model by what their quantization costs; "
                                         "check TVM's build of it against onnxruntime",
                    description="Build the QDQ model (onnxruntime's quantize_static, QuantFormat.QDQ) with TVM, "
                                "compare every quantized op with the float model (onnxruntime) and with "
                                "onnxruntime's run of the same QDQ model, then rank the ops by the outputs' SQNR with "
                                "each op in float in turn (one build holds every variant).  Writes DIR/quantization.csv, "
                                "DIR/sensitivity.csv and, with --target-sqnr, DIR/keep_float.onnx.  Exit 1 when TVM "
                                "differs from onnxruntime on the QDQ model or the target cannot be reached.",
                    epilog=EXIT_HELP)
    quant.add_argument("float_model", type=Path, metavar="FLOAT", help="the float ONNX model")
    quant.add_argument("quantized_model", type=Path, metavar="QUANTIZED", help="its QDQ model")
    quant.add_argument("--inputs", type=Path, metavar="F",
                       help=".npz of arrays named as the model's inputs (.npy for one input); default: random, "
                            "uniform in [-1, 1), seed 0")
    quant.add_argument("--shapes", action="append", default=[], metavar="NAME=AxB",
                       help="sizes for an input declared with symbolic dimensions, e.g. x=1x3x224x224 (repeat "
                            "for each such input; default: the sizes of --inputs)")
    quant.add_argument("--target-sqnr", type=float, metavar="DB",
                       help="find the ops to keep in float so that the outputs' SQNR reaches DB")
    quant.add_argument("-o", "--output", type=Path, default=Path("quantization"), metavar="DIR",
                       help="folder for the tables (default: ./quantization)")
    quant.add_argument("--view", action="store_true",
                       help="also write Model Explorer overlays of the float model to DIR/view (needs tvm_probe[view])")
    quant.add_argument("--pipeline", default=DEFAULT_PIPELINE, choices=PIPELINES,
                       help=f"TVM pipeline (default: {DEFAULT_PIPELINE})")
    quant.add_argument("--target", default=DEFAULT_TARGET, help=f"TVM target (default: {DEFAULT_TARGET})")


def _cmd_quantization(args, progress) -> int:
    float_model = load_onnx(args.float_model)
    load_onnx(args.quantized_model)  # a missing file is said before any work
    given = _read_inputs(args.inputs, float_model) if args.inputs is not None else None
    shapes = shapes_flags(args.shapes)
    inputs = model_inputs(float_model, given, shapes)
    outcome = quantization_investigation(float_model, args.quantized_model, inputs, args.output, args.target_sqnr,
                                         args.pipeline, args.target, progress, view=args.view, shapes=shapes)
    drawn = "from " + str(args.inputs) if given is not None else "random, uniform in [-1, 1), seed 0"
    print(f"inputs ({drawn}): " + ", ".join(f"{n} {list(a.shape)} {a.dtype}" for n, a in inputs.items()))
    for line in outcome.lines():
        print(line)
    return outcome.exit_code


def _read_inputs(path: Path, model) -> dict[str, np.ndarray]:
    """``--inputs``: an .npz of arrays by input name, or an .npy for a model with one input."""
    try:
        loaded = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ConfigError(f"--inputs: cannot read '{path}' ({one_line(err)}): give a .npz (or .npy) file") from None
    if isinstance(loaded, np.ndarray):
        names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
        if len(names) != 1:
            raise ConfigError(f"--inputs: '{path}' holds one array and the model has inputs {', '.join(names)}: "
                              "give a .npz with one array per input name")
        return {names[0]: loaded}
    with loaded:
        return {k: loaded[k] for k in loaded.files}


_COMMANDS["quantization"] = _cmd_quantization


def main(argv=None) -> int:
    """Entry point of the ``tvm-probe`` console script."""

    args = _parser().parse_args(argv)
    args.terms = Terms(RUN_FLAGS)  # a run knows its config's file and lines once it read it
    progress = Progress(enabled=False if args.quiet else None)
    try:
        with _logging_in_cli_terms(args):
            status = _COMMANDS[args.command](args, progress)
    except TVMError as err:
        status = _error(f"TVM failed: {err.said(args.terms)}", Exit.TVM_FAILED, err)
    except ProbeError as err:
        status = _error(f"error: {err.said(args.terms)}", Exit.BAD_INPUT, err)
    except KeyboardInterrupt:  # dumps and reports are written atomically: nothing half-written remains
        status = _error("error: interrupted (no partial dump or report is left behind)", Exit.BAD_INPUT)
    except BrokenPipeError:  # `tvm-probe get ... | head`
        status = Exit.OK
    except Exception as err:  # a bug: keep it apart from divergence (1) and bad input (2)
        if os.environ.get(TRACEBACK_ENV):
            raise
        status = _error(f"internal error: {type(err).__name__}: {one_line(err)} (a bug in tvm_probe or an "
                        "unsupported TVM behaviour; set TVM_PROBE_TRACEBACK=1 for the traceback)", Exit.INTERNAL)
    return int(status)


class _CliTerms(logging.Formatter):
    """tvm_probe's log records for the terminal: a notice that carries its remedy (sizes chosen for
    unknown dimensions) said with the flag or config key that changes it."""

    def __init__(self, args):
        super().__init__("%(name)s: %(message)s" if args.verbose else "tvm-probe: %(message)s")
        self.args = args

    def format(self, record) -> str:
        notice = getattr(record, "notice", None)
        if notice is None:
            return super().format(record)
        return f"tvm-probe: {notice.notice(self.args.terms)}"


@contextlib.contextmanager
def _logging_in_cli_terms(args):
    """While a command runs: tvm_probe's warnings (every record with -v) on stderr, in the
    command line's terms; the logger is as it was afterwards (main() may run again in a process)."""
    logger = logging.getLogger("tvm_probe")
    saved = logger.propagate, logger.level
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_CliTerms(args))
    logger.addHandler(handler)
    logger.propagate = False  # (with -v the root logger prints too: once is enough)
    logger.setLevel(logging.INFO if args.verbose else logging.WARNING)
    if args.verbose:  # TVM's own Python loggers too
        logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = saved[0]
        logger.setLevel(saved[1])


def console_main() -> None:
    """The console script: :func:`main`, then exit with its status whatever Ctrl-C does now.

    While the interpreter shuts down, Python restores the default SIGINT action, so a late
    Ctrl-C would kill the process with the signal (status -2) after the result was printed.
    """
    try:
        status = watched_status(sys.argv[1:], _error)  # a watched child did the work (None: do it here)
        if status is None:
            status = main()
    except KeyboardInterrupt:  # before main's own handling began (while parsing arguments)
        status = _error("error: interrupted", Exit.BAD_INPUT)
    _ignore_late_interrupts()
    sys.exit(status)


def _error(message: str, status: Exit, err: BaseException | None = None) -> Exit:
    """Print the one-line error, after freeing the TVM objects ``err``'s traceback holds: a failed
    importer's BlockBuilder logs "destroyed with remaining blocks!" when freed, and that belongs
    in the log (-v), not after the line on stderr."""
    if err is not None:
        with native_log_to_logging():
            release_native(err)
    print(f"tvm-probe: {message}", file=sys.stderr)
    return status


def _ignore_late_interrupts() -> None:
    """The work is done and reported: a Ctrl-C now must not turn the exit status into a signal."""
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    except ValueError:  # not the main thread (main() called from a thread): nothing to protect
        pass


if __name__ == "__main__":
    console_main()
