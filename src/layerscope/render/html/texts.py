"""The HTML page's shown texts: the cards, the memory timeline's axis labels and its sentence, the
pipeline's heading, rank labels and sentence, the coverage lines. Each number in them is written
here by ``render.units`` (the terminal's styles: SI counts, IEC bytes, seconds, parameters with
thousands separators), so the page's script formats no number: it places these strings and
scales shapes by the raw values.

Everything reads the reports' JSON (a report's ``to_dict()`` or its saved file), like the page.
"""

from __future__ import annotations

from typing import Any

from ..units import decimals, iec, params, percent, seconds, si

__all__ = ["cards", "memory_axis", "memory_sentence", "plan_texts", "coverage_texts", "rest_note", "AXIS"]

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
