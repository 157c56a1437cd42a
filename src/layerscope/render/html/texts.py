"""The HTML page's shown texts: the cards, the memory timeline's axis labels and its sentence, the
pipeline's heading, rank labels and sentence, the coverage lines. Each number in them is written
here by ``render.units`` (the terminal's styles: SI counts, IEC bytes, seconds, parameters with
thousands separators), so the page's script formats no number: it places these strings and
scales shapes by the raw values.

Everything reads the reports' JSON (a report's ``to_dict()`` or its saved file), like the page.
"""

from __future__ import annotations

from typing import Any

from ...reports.parallel import STEP_PARTS
from ...options import iec
from ..units import decimals, fmt, params, percent, seconds, si

__all__ = ["cards", "memory_axis", "memory_sentence", "plan_texts", "coverage_texts", "rest_note", "AXIS",
           "parallel_texts", "parallel_cards"]

AXIS = (0, 0.25, 0.5, 0.75, 1)     # the memory timeline's y ticks, as fractions of its highest point


def _summary_cards(t: dict) -> list[list[str]]:
    shared = f" ({params(t['shared_params'])} shared)" if t.get("shared_params") else ""
    out = [["Parameters", si(t["params"]), params(t["params"]) + shared],
           ["Forward MACs", si(t["macs"]), "FLOPs " + si(t["flops"])]]
    b = t.get("backward") or {}
    if b.get("macs"):
        out.append(["Backward MACs", si(b["macs"]), "FLOPs " + si(b["flops"])])
    out.append(["Bytes moved", iec(t["bytes_read"] + t["bytes_written"]),
                f"read {iec(t['bytes_read'])}, written {iec(t['bytes_written'])}"])
    return out


def _plain(t: dict, phase: str) -> tuple[bool, Any]:
    """A phase's time without the hooks where the run measured it, else with them; (False, None)
    when the totals have neither (a step's totals name their phases differently)."""
    for k in (f"{phase}_plain", f"{phase}_instrumented"):
        if k in t:
            return True, t[k]
    return False, None


def _latency_card(t: dict) -> list[str]:
    _, fwd = _plain(t, "forward")
    has_bwd, bwd = _plain(t, "backward")
    return ["Forward time", seconds(fwd), f"backward {seconds(bwd)}" if has_bwd else f"median of {t.get('runs')} repeats"]


def cards(summary: dict | None, memory: dict | None, latency: dict | None, plan: dict | None) -> list[list[str]]:
    """The headline cards, [title, value, under it], in the page's order."""
    out: list[list[str]] = []
    if summary is not None:
        out += _summary_cards(summary["totals"])
    if memory is not None:
        mode = "training" if memory["model"]["options"].get("training") else "inference"
        out.append(["Peak memory", iec(memory["peak_bytes"]), f"{len(memory['steps'])} step(s), {mode}"])
    if latency is not None:
        out.append(_latency_card(latency["totals"]))
    if plan is not None:
        imb = plan.get("imbalance")
        out.append(["Stages", str(len(plan["stages"])),
                    f"bottleneck / ideal {decimals(imb, 3)}" if imb else f"by {plan['by']}"])
        tl = plan.get("timeline")
        if tl:
            out.append(["Step time", seconds(tl["step_time"]),
                        f"predicted, {plan['schedule']}, bubble {percent(tl['bubble'], 1)}"])
    return out


def memory_axis(tl: dict) -> dict:
    """The timeline's scale: its highest stacked point (at least 1 byte) and the y labels at AXIS."""
    n = len(tl["x"])
    top = max([1] + [sum(tl["bytes"][c][i] for c in tl["categories"]) for i in range(n)])
    return {"top": top, "ticks": [iec(top * f) for f in AXIS]}


def memory_sentence(memory: dict, tl: dict) -> str:
    """Under the timeline: the peak and what it holds (the terminal's "At the peak"), and what was drawn."""
    held = ", ".join(f"{k.replace('_', ' ')} {iec(v)}" for k, v in memory["breakdown"].items() if v)
    return (f"Peak {iec(memory['peak_bytes'])} ({held}); {tl['ops']} ops, {len(tl['x'])} points drawn "
            "(the highest of each bucket kept).")


def _rank_labels(tl: dict) -> list[str]:
    labels = []
    for r in range(len(tl["busy"])):
        st = sorted({b[1] for b in tl["blocks"] if b[0] == r})
        what = f" (stages {','.join(map(str, st))})" if len(st) > 1 else f" (stage {st[0]})" if st else ""
        labels.append(f"rank {r}{what}")
    return labels


def plan_texts(plan: dict) -> dict[str, Any]:
    """The pipeline section's heading and, with a predicted step, its times, rank labels and sentence."""
    out: dict[str, Any] = {"heading": f"Pipeline stages ({plan['schedule']}, {plan['microbatches']} micro-batches, "
                                      f"by {plan['by']})"}
    t = plan.get("timeline")
    if t:
        step, pipe, busy = seconds(t["step_time"]), seconds(t["pipeline_time"]), [seconds(b) for b in t["busy"]]
        out["timeline_text"] = {"step": step, "pipeline": pipe, "busy": busy, "ranks": _rank_labels(t),
                                "sentence": f"Step time {step} predicted: pipeline {pipe}, bubble "
                                            f"{percent(t['bubble'], 1)}; busy per rank {', '.join(busy)}."}
    return out


def coverage_texts(cov: dict) -> dict[str, Any]:
    """The coverage section's lines: each op with no formula (how often, where), the modules never called."""
    def op(u: dict) -> str:
        where = " in " + ", ".join(u["layers"][:5]) if u.get("layers") else ""
        return f"{u['op']} \u00d7{u['count']}{where}"
    never = cov["uncalled_modules"]
    return {"uncounted": [op(u) for u in cov["uncounted"]],
            "uncalled": f"Modules never called ({len(never)}): {', '.join(never[:20])}" if never else None}


def rest_note(roles: int, layers: int, text: str) -> str:
    """Under a chart: what did not fit as bars, summed."""
    return f"and {roles} more role(s) in {layers} layer(s), {text} together"


_SHOWN_PLANS, _SHOWN_MISSES = 12, 6      # the plan chart's rows: the fastest that fit, the nearest misses


def _rank_roles(par: dict) -> list[dict]:
    """The memory chart's rows: per role (ranks that hold the same bytes), the parts of its peak."""
    ranks = par["plans"][0]["ranks"]
    out = []
    for role in par["roles"]:
        r = ranks[role["ranks"][0]]
        out.append({"label": f"rank{'s' if len(role['ranks']) > 1 else ''} {role['label']}",
                    "parts": {k: v for k, v in r["breakdown"].items() if v}, "value": r["peak_bytes"],
                    "text": iec(r["peak_bytes"])})
    return out


def _plan_rows(search: dict) -> tuple[list[dict], str | None]:
    """The plan chart's rows: the fitting plans by step time, then the nearest misses by excess."""
    rows = search["candidates"]
    fitting = [r for r in rows if r["status"] == "fits"]
    # the nearest misses: those simulated first (their peak is known), then those over by a bound
    misses = sorted((r for r in rows if r["status"] in ("oom", "oom-bound", "dominated") and r["over_bytes"]),
                    key=lambda r: (r["status"] != "oom", r["over_bytes"]))
    out = []
    for r in fitting[:_SHOWN_PLANS] + misses[:_SHOWN_MISSES]:
        over = r["over_bytes"] if r["status"] != "fits" else 0
        bound = r["status"] != "oom" and r["status"] != "fits"      # excess known as a lower bound only
        out.append({"label": r["label"], "fits": r["status"] == "fits", "step": r["step_time"],
                    "step_text": seconds(r["step_time"]) if r["step_time"] is not None else "not simulated",
                    "peak": r["peak_bytes"], "over": over,
                    "peak_text": iec(r["peak_bytes"]) if r["peak_bytes"] is not None else
                    f"over by {'at least ' if bound else ''}{iec(over)}",
                    "mfu_text": percent(r["mfu"], 1) if r["mfu"] is not None else "--",
                    "status": "fits" if r["status"] == "fits" else
                    f"over by {'at least ' if bound else ''}{iec(over)}",
                    "why": r["why"] if r["status"] != "fits" else ""})
    left = []
    if len(fitting) > _SHOWN_PLANS:
        left.append(f"{len(fitting) - _SHOWN_PLANS} more plans fit")
    if len(misses) > _SHOWN_MISSES:
        left.append(f"{len(misses) - _SHOWN_MISSES} more do not")
    return out, ("; ".join(left) + " (the JSON lists every candidate)") if left else None


def parallel_texts(par: dict) -> dict[str, Any]:
    """The sharded-training section: its heading, the peak per rank by part, the predicted step's
    parts, the search's plans (fitting by step time, then the nearest misses) and why each family
    lost, the largest rank's collectives, and the run's measurement beside the prediction."""
    p = par["plans"][0]
    label = next((f["value"] for f in par.get("context", []) if f["label"] == "Configuration"), "")
    out: dict[str, Any] = {"heading": f"Sharded training: {label}", "roles": _rank_roles(par), "notes": list(par["notes"]),
                           "limit": p["limit_bytes"], "limit_text": iec(p["limit_bytes"]) if p["limit_bytes"] else None}
    # the columns the terminal shows, less those no role has a byte in
    cols = [c for c in par.get("columns", []) if c["unit"] != "bytes" or c["key"] == "peak_bytes"
            or any(r["values"].get(c["key"]) for r in par["roles"])]
    out["table"] = {"headers": ["Ranks"] + [c["header"] for c in cols],
                    "rows": [[r["label"]] + [fmt(c["unit"], r["values"].get(c["key"])) for c in cols]
                             for r in par["roles"]]}
    t = p.get("timing")
    if t:
        parts = [{"label": name, "value": t[k], "text": seconds(t[k])} for k, name in STEP_PARTS if t.get(k)]
        rest = t["step_time"] - sum(x["value"] for x in parts)
        if rest > 1e-9 * t["step_time"]:
            parts.append({"label": "pipeline bubble and the rest", "value": rest, "text": seconds(rest)})
        rate = (f", {p['tokens_per_s']:,.0f} tokens/s per GPU" if p.get("tokens_per_s") else "") + \
            (f", MFU {percent(t['mfu'], 1)}" if t.get("mfu") is not None else "")
        out["step"] = {"parts": parts, "total": t["step_time"],
                       "sentence": f"One step, predicted on the {t['gpu']}: {seconds(t['step_time'])}{rate}"
                                   + (f"; bubble {percent(t['bubble'], 1)}" if t.get("bubble") else "") + "."}
    big = max(p["ranks"], key=lambda r: r["peak_bytes"])
    out["collectives"] = [
        [c["kind"], c["group"] + (f" ({c['group_size']})" if c["kind"] not in ("send", "recv") else ""),
         str(c["calls"]), iec(c["bytes_written"] if c["kind"] in ("all-gather", "recv") else c["bytes_read"]),
         iec(c["ring_bytes"]) if c["kind"] not in ("send", "recv") else "--"] for c in big["collectives"]]
    out["collectives_rank"] = big["rank"]
    m = p.get("measured")
    if m:
        out["measured"] = (f"Run for real: losses {'equal' if m['loss_equal'] else 'DIFFER from'} one process "
                           f"(largest relative difference {m['max_rel_loss_diff']:.1e}); step "
                           f"{seconds(m['step_time'])}; peaks "
                           + ", ".join(f"rank {i} {iec(r['peak_bytes'])}" for i, r in enumerate(m["ranks"])) + ".")
    s = par.get("search")
    if s:
        rows, note = _plan_rows(s)
        counts = ", ".join(f"{n} {k}" for k, n in s["counts"].items())
        out["plans"] = {"rows": rows, "note": note,
                        "sentence": f"{len(s['candidates'])} configurations of global batch {s['global_batch']} "
                                    f"({counts}); {s['simulated']} simulated in {s['seconds']:.0f} s."}
        out["families"] = [f"{f['family']}: {f['why']}" for f in s["families"]]
    return out


def parallel_cards(par: dict) -> list[list[str]]:
    """The sharded-training cards: the largest rank's peak against the limit, the predicted step, the search."""
    p = par["plans"][0]
    limit = ("" if p["limit_bytes"] is None else
             f"; limit {iec(p['limit_bytes'])}: " + ("fits" if p["fits"] else f"over by {iec(p['over_bytes'])}"))
    out = [["Peak per rank", iec(p["peak_bytes"]), f"the largest of {p['gpus']}{limit}"]]
    if p.get("step_time") is not None:
        out.append(["Step time", seconds(p["step_time"]), "predicted" + (f", MFU {percent(p['mfu'], 1)}"
                                                                         if p.get("mfu") is not None else "")])
    s = par.get("search")
    if s:
        fits = s["counts"].get("fits", 0)
        out.append(["Plans that fit", str(fits), f"of {len(s['candidates'])} candidates"])
    return out
