"""The Chrome trace of a LatencyReport (its JSON comes from render.json, like every kind's)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..reports.latency import LatencyReport

__all__ = ["chrome_trace"]


def _lanes(spans: list[tuple[float, float, Any]]) -> list[tuple[int, float, float, Any]]:
    """Put spans on as few tracks as keep every track properly nested (a trace viewer drops or
    cuts slices that overlap without nesting): (track, start, end, payload)."""
    lanes: list[list[float]] = []          # per track: the ends of the spans still open
    out = []
    for start, end, payload in sorted(spans, key=lambda s: (s[0], -s[1])):
        for k, open_ends in enumerate(lanes):
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            if not open_ends or open_ends[-1] >= end:
                break
        else:
            k = len(lanes)
            lanes.append([])
        lanes[k].append(end)
        out.append((k, start, end, payload))
    return out


def _ts_dur(start: float, end: float) -> dict[str, float]:
    """A slice's start and length in microseconds on a grid of 2**-20 us, where the float sum ts + dur
    is the end exactly (for runs up to an hour): a span that ends where its parent or the next one
    ends or begins must not overlap it by an ulp, as ``start * 1e6 + (end - start) * 1e6`` can."""
    ts, te = (round(t * 1e6 * 2**20) / 2**20 for t in (start, end))
    return {"ts": ts, "dur": te - ts}


def chrome_trace(rep: "LatencyReport") -> dict[str, Any]:
    """Trace Event Format (Chrome's, which Perfetto reads): one complete event per module call and
    phase of the representative run, in microseconds from its start; forward on the first tracks,
    backward after them."""
    events: list[dict[str, Any]] = []
    tid = 0
    for phase in ("forward", "backward"):
        spans = [(s[0], s[1], r) for r in rep.layers if (s := getattr(r, f"{phase}_span")) is not None]
        placed = _lanes(spans)
        n = 1 + max((k for k, *_ in placed), default=-1)
        for k in range(n):
            events.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tid + k,
                           "args": {"name": phase if n == 1 else f"{phase} {k + 1}"}})
        for k, start, end, r in placed:
            events.append({"ph": "X", "name": r.name, "cat": phase, "pid": 1, "tid": tid + k,
                           **_ts_dur(start, end),
                           "args": {"type": r.type, "call_index": r.call_index, "depth": r.depth,
                                    "flops": r.flops if phase == "forward" else r.backward_flops}})
        tid += n
    events.insert(0, {"ph": "M", "name": "process_name", "pid": 1,
                      "args": {"name": f"layerscope {rep.model_name} on {rep.device}"}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"tool": "layerscope", "model": rep.model_name, "device": rep.device}}
