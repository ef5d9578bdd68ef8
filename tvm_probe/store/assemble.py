"""What a dump of a probe's run holds, and a run that streams into a dump as it goes.

The dump *format* is :mod:`tvm_probe.store.dump`'s; this module decides the content from a live
:class:`~tvm_probe.Probe`: node outputs as captured, and the source values that are not node
outputs (recomputed, folded, constants, symbolic sizes), recomputed one fused call site at a
time so that streaming holds at most one site's values in memory.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..core.errors import DumpExistsError
from ..core.sources import Kind, Served
from .atomic import replace_folder
from .dump import DumpContent, DumpWriter, StreamedOutputs, node_tensor_names, tensor_key, write_dump

# stored as node outputs, or nothing to store
# (a sequence: its elements are stored, each a value of its own; the sources record lists them)
_NOT_VALUES = (Served.CAPTURED, Served.VIEW, Served.INPUT, Served.UNAVAILABLE, Served.UNKNOWN, Served.SEQUENCE)


@dataclass(frozen=True)
class DumpOptions:
    """Options of :meth:`Probe.dump` and of ``Probe.run(..., stream_to=...)``.

    Attributes:
        overwrite: replace an existing folder (refused by default).
        include_weights: store the weights too (left out by default: they are the model's).
        recomputed: store the values kept inside fused kernels (default True).
        timings: store per-kernel times (default True): the one part of a dump that differs
            between runs of the same model, inputs and pipeline.
        metadata: JSON-friendly data to keep with the dump (e.g. where the model came from).
    """

    overwrite: bool = False
    include_weights: bool = False
    recomputed: bool = True
    timings: bool = True
    metadata: dict | None = None


def dump_probe(probe, path: Path, opts: DumpOptions) -> Path:
    """Write ``probe``'s last run to ``path`` (see :meth:`Probe.dump`)."""

    capture = probe.last_capture
    outputs = {i: [_host(a)] for i, a in enumerate(capture.inputs) if _is_tensor(a)}
    outputs.update({probe.num_input_nodes + s: outs for s, outs in capture.outputs.items()})
    keys = value_keys(probe, opts)
    content = dump_content(probe, outputs, dict(values(probe, keys)), opts)
    return write_dump(Path(path), content, overwrite=opts.overwrite)


def dump_calls(probe, path: Path, opts: DumpOptions) -> Path:
    """Write every :meth:`~tvm_probe.Probe.call` of ``probe`` to ``path``.

    Layout: ``calls.json`` (call, function, time, captured bytes, folder of each call) and
    ``calls/<call:04d>_<function>/``, each a dump in the layout :meth:`Probe.dump` writes for
    one ``run()`` (so every reader of a single-run dump reads each call).  Written under a
    temporary name and renamed when complete.
    """
    import json
    import os
    import shutil


    path = Path(path)
    if path.exists() and not opts.overwrite:
        raise DumpExistsError(f"{path} exists: pass overwrite=True to replace it")
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "calls").mkdir(parents=True)
    listed = []
    try:
        for record in probe.call_records:
            if record.capture is None:  # dropped by forget_calls: listed, without values
                listed.append({"call": record.index, "function": record.function, "folder": None})
                continue
            folder = f"calls/{record.index:04d}_{record.function}"
            with probe.in_call(record.index) as function_probe:
                dump_probe(function_probe, tmp / folder, opts)
            listed.append({"call": record.index, "function": record.function,
                           "time_us": record.time_us if opts.timings else None,
                           "captured_bytes": record.captured_bytes, "folder": folder})
        (tmp / "calls.json").write_text(json.dumps({"format": "tvm_probe.calls/1", "calls": listed}, indent=1))
        return replace_folder(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _is_tensor(value) -> bool:
    """A call argument with an array value (not a KV cache, shape or tuple of weights)."""
    import numpy as np

    return isinstance(value, np.ndarray) or (hasattr(value, "numpy") and hasattr(value, "shape"))


def _host(value):
    import numpy as np

    return value if isinstance(value, np.ndarray) else value.numpy()


def run_streaming(probe, arrays, plan, path: Path, opts: DumpOptions, execute, serve):
    """One run whose copies go straight into a dump at ``path``; returns the Capture.

    ``probe`` (a live :class:`~tvm_probe.Probe`) says how the run goes: ``execute(sink)`` runs
    its executable once, handing each copied call site's outputs to ``sink`` as produced, and
    ``serve(capture)`` makes that run the one ``probe`` serves values from (the values the dump
    stores besides node outputs are read from it).
    """

    n_in, nodes = probe.num_input_nodes, probe.node_infos
    counts = {i: 1 for i in range(n_in)}
    counts.update({n_in + s.index: s.num_outputs for s in probe.kernel_map.sites if plan.wants_output(s.index)})
    with DumpWriter(path, probe.device_label, opts.overwrite) as writer:
        writer.open_tensors(node_tensor_names(nodes, counts))
        for i, array in enumerate(arrays):
            writer.write_tensor(tensor_key(nodes[i].name, i, 0), array)

        def sink(site: int, outs) -> None:
            node = n_in + site
            for j, out in enumerate(outs):
                writer.write_tensor(tensor_key(nodes[node].name, node, j), out)

        capture = execute(sink)
        capture.outputs = StreamedOutputs(writer.close_tensors(), nodes, n_in)
        serve(capture)
        keys = value_keys(probe, opts)
        writer.finish(dump_content(probe, {}, {}, opts, keys), values(probe, keys, cache=False))
        writer.commit()
    return capture


def dump_content(probe, outputs, held_values, opts: DumpOptions, keys=None):
    """The :class:`~tvm_probe.store.dump.DumpContent` of ``probe``'s last run."""

    capture = probe.last_capture
    wanted = probe.captured_keys
    return DumpContent(
        sources=probe.sources_map, servings=probe.servings, nodes=probe.node_infos, node_outputs=outputs, values=held_values,
        device=probe.device_label, model_hash=probe.model_hash,
        target=str(probe.built.target), pipeline=probe.built.pipeline,
        total_us=capture.total_us if opts.timings else None, timings=opts.timings,
        metadata={**(opts.metadata or {}), **({"capture": sorted(wanted)} if wanted is not None else {})},
        import_fixes=[f.to_record() for f in probe.import_fixes],
        compile_warnings=[w.to_record() for w in probe.compile_warnings],
        value_keys=list(keys if keys is not None else held_values))


def value_keys(probe, opts: DumpOptions) -> list[str]:
    """Keys of the values a dump stores besides node outputs, grouped by the site computing them."""
    kmap, wanted, servings = probe.kernel_map, probe.captured_keys, probe.servings
    keys = []
    for value in probe.sources_map:
        served = servings[value.key].served
        if served in _NOT_VALUES:
            continue
        if value.kind is Kind.PARAM and not opts.include_weights:
            continue
        if served is Served.RECOMPUTED and not opts.recomputed:
            continue
        if served in (Served.RECOMPUTED, Served.FOLDED) and wanted is not None and value.key not in wanted:
            continue
        if served is Served.RECOMPUTED and not probe.can_recompute(kmap.sites[kmap.site_of(value.key)]):
            continue
        keys.append(value.key)
    return sorted(keys, key=lambda k: kmap.site_of(k) if servings[k].served is Served.RECOMPUTED else -1)


def values(probe, keys, cache: bool = True):
    """``(key, value)`` in ``keys`` order, recomputing one fused site at a time.

    With ``cache=False`` (streaming) only the current site's values are held in memory.
    """
    kmap = probe.kernel_map
    current, held = None, {}
    for key in keys:
        if cache or probe.servings[key].served is not Served.RECOMPUTED:
            yield key, probe.get_tensor(key)
            continue
        site = kmap.site_of(key)
        if site != current:
            current, held = site, probe.values_kept_inside(kmap.sites[site], key)
        yield key, held[key]

