"""`layerscope report` (one HTML page), `compare` (two models or saved reports) and `list-presets`."""

from __future__ import annotations

import argparse
import os
import sys

from ..options import iec
from .common import build_spec, live, status, write_output
from .flags import given


def _load_json(path: str) -> dict:
    """A saved report (``--format json``): its dict, with ``kind`` (reports saved before the field
    existed are summaries)."""
    import json

    from ..errors import InputError
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from e
    except ValueError as e:
        raise InputError(f"{path} is not JSON: {e}") from e
    if not isinstance(data, dict) or "schema_version" not in data:
        raise InputError(f"{path} is not a layerscope report (no schema_version)")
    data.setdefault("kind", "summary")
    return data


_PART = {"summary": "summary", "memory": "memory", "latency": "latency", "stage_plan": "plan", "parallel": "parallel"}


def _wrote(ns: argparse.Namespace, code: int) -> int:
    """`report` writes only a file: say where (it printed nothing on success before, issue 34)."""
    if code == 0:
        sys.stdout.write(f"wrote {ns.output} ({iec(os.path.getsize(ns.output))})\n")
    return code


def run_report(ns: argparse.Namespace) -> int:
    from ..errors import InputError
    from ..render.html import html_page

    if all(s.endswith(".json") for s in ns.spec):
        parts: dict = {}
        for path in ns.spec:
            data = _load_json(path)
            part = _PART.get(data["kind"])
            if part is None or part in parts:
                raise InputError(f"{path}: a {data['kind']} report "
                                 + ("is already on the page" if part else "cannot go on the page"))
            parts[part] = data
        return _wrote(ns, write_output(ns, html_page(ns.title, **parts)))
    if len(ns.spec) > 1:
        raise InputError("report takes one model spec, or saved JSON reports (*.json)")
    from ..api import analyze, memory, partition, profile
    from ..options import MemoryOptions, optimizer_factory
    ns.spec = ns.spec[0]
    device = "cpu" if ns.profile and not ns.device else ns.device   # timing needs real weights
    model, args, kwargs = build_spec(ns, device)
    with status("analysing", ns):
        summary = analyze(model, *args, device=device, backward=ns.training, gpu=ns.gpu, attention=ns.attention,
                          forward_kwargs=kwargs)
    mem = lat = plan = None
    if ns.memory:
        model.train(ns.training)           # a training step with dropout on; inference without
        with status("simulating the step", ns):
            # the step's flags as MemoryOptions' fields (cli/flags.py); the optimizer only for a training step
            step = {**given(ns, MemoryOptions), "optimizer": optimizer_factory(ns.optimizer) if ns.training else None,
                    "training": ns.training, "device": device}
            mem = memory(model, *args, options=MemoryOptions(**step), forward_kwargs=kwargs)
    model.eval()                           # timed and split as `profile` and `split` run it
    if ns.profile:
        lat = profile(model, *args, repeats=ns.repeats, backward=ns.training, progress=live(ns),
                      forward_kwargs=kwargs)
    if ns.stages:
        with status("planning", ns):
            plan = partition(model, *args, stages=ns.stages, by=ns.by, optimizer=ns.optimizer, device=device,
                             **kwargs)
    return _wrote(ns, write_output(ns, summary.to_html(memory=mem, latency=lat, plan=plan, title=ns.title)))


def _sides(ns: argparse.Namespace, spec: str) -> list[dict]:
    """One side of a comparison: a saved report's dict, or a fresh analysis of a model spec (with
    its training-step memory for --memory, its per-layer times for --profile)."""
    if spec.endswith(".json"):
        return [_load_json(spec)]
    from ..api import analyze, memory, profile
    ns.spec = spec
    device = "cpu" if ns.profile and not ns.device else ns.device       # timing needs real weights
    model, args, kwargs = build_spec(ns, device)
    with status(f"analysing {spec}", ns):
        out = [analyze(model, *args, device=device, forward_kwargs=kwargs).to_dict()]
        if ns.memory:
            out.append(memory(model, *args, optimizer="adamw", device=device,
                              forward_kwargs=kwargs).to_dict(timeline=False))
    if ns.profile:
        model.eval()
        out.append(profile(model, *args, progress=live(ns), forward_kwargs=kwargs).to_dict())
    return out


def run_compare(ns: argparse.Namespace) -> int:
    import json

    from ..reports.compare import compare
    from ..errors import InputError
    a, b = _sides(ns, ns.a), _sides(ns, ns.b)
    if len(a) != len(b):
        raise InputError("compare two saved reports, or two model specs (--memory and --profile apply to specs)")
    diffs = [compare(x, y, names=(ns.a, ns.b)) for x, y in zip(a, b)]
    if ns.format == "json":
        return write_output(ns, json.dumps([d.to_dict() for d in diffs] if len(diffs) > 1 else diffs[0].to_dict(),
                                     indent=2))
    if ns.format == "csv":
        from ..render.csv import csv_text
        rows = [{"compared": d.compared, **r} for d in diffs for r in d.rows()]
        return write_output(ns, csv_text(list(dict.fromkeys(k for r in rows for k in r)), rows))
    view = {"depth": ns.depth, "changed": ns.changed, "fold": not ns.expand}
    if ns.output is None and sys.stdout.isatty():       # fitted to the terminal
        for d in diffs:
            d.print(**view)
        return 0
    return write_output(ns, "\n".join(d.table(**view) for d in diffs))


def run_list_presets(ns: argparse.Namespace) -> int:
    import json

    from ..render.csv import csv_text
    from ..reports.listings import PresetList
    from ..specs import presets

    listing = PresetList(presets())
    # the JSON and CSV keep their plain shape (a list of presets, tests/goldens/cli), not the
    # versioned report schema; the table is the kind's
    rows = [{"name": p.name, "model": p.model, "params": p.params, "default_inputs": p.default_inputs,
             "description": p.description} for p in listing.presets]
    if ns.format == "json":
        return write_output(ns, json.dumps(rows, indent=2))
    if ns.format == "csv":
        return write_output(ns, csv_text(list(rows[0]), rows))
    if ns.output is None and sys.stdout.isatty():       # fitted to the terminal
        listing.print()
        return 0
    return write_output(ns, listing.table())
