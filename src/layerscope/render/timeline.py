"""A simulated pipeline step drawn as text: one row per rank, time across.

Each character is a slice of the step: the micro-batch number (mod 10) of the forward running on
that rank, a letter (a = micro-batch 0, mod 10) for a backward (zero bubble: its input gradient,
I), a capital letter for zero bubble's weight gradients (W), ``·`` where the rank idles. With
rich, forwards are blue, backwards green and weight gradients yellow. Interleaved stages are told apart by their rows'
labels (the stages on each rank).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .units import seconds

if TYPE_CHECKING:
    from ..planning.steptime.schedule import Timeline

__all__ = ["timeline_lines", "timeline_text", "timeline_rich"]

_IDLE = "·"


def _cells(tl: "Timeline", rank: int, width: int) -> list[tuple[str, str]]:
    """(character, kind) per column: kind "F", "B", "W" or "" (idle)."""
    blocks = [b for b in tl.blocks if b.rank == rank]
    span = tl.pipeline_time or 1.0
    out, j = [], 0
    for c in range(width):
        t = (c + 0.5) * span / width
        while j < len(blocks) and blocks[j].end <= t:
            j += 1
        b = blocks[j] if j < len(blocks) and blocks[j].start <= t else None
        if b is None:
            out.append((_IDLE, ""))
        elif b.kind == "F":
            out.append((str(b.microbatch % 10), "F"))
        elif b.kind == "W":
            out.append((chr(ord("A") + b.microbatch % 10), "W"))
        else:
            out.append((chr(ord("a") + b.microbatch % 10), "B"))
    return out


def timeline_lines(tl: "Timeline", width: int | None = None) -> list[tuple[str, list[tuple[str, str]]]]:
    """(row label, cells) per rank, the cells fitted to ``width`` columns in all (default 100)."""
    stages: dict[int, list[int]] = {}
    for b in tl.blocks:
        stages.setdefault(b.rank, [])
        if b.stage not in stages[b.rank]:
            stages[b.rank].append(b.stage)
    labels = {r: f"rank {r} ({','.join(map(str, sorted(st)))})" if len(st) > 1 else f"rank {r}"
              for r, st in stages.items()}
    pad = max((len(x) for x in labels.values()), default=6) + 2
    w = max(20, (width or 100) - pad - 1)
    return [(labels[r].ljust(pad), _cells(tl, r, w)) for r in sorted(stages)]


def _legend(tl: "Timeline") -> str:
    zb = any(b.kind == "W" for b in tl.blocks)
    back = ("small letters: its input gradient (a = 0), capitals: its weight gradients" if zb
            else "letters: its backward (a = 0)")
    return (f"Timeline of one step ({seconds(tl.pipeline_time)} across; digits: forward of micro-batch n, "
            f"{back}; {_IDLE} idle)")


def timeline_text(tl: "Timeline", width: int | None = None) -> str:
    rows = timeline_lines(tl, width)
    return "\n".join([_legend(tl)] + [label + "".join(ch for ch, _ in cells) for label, cells in rows]) + "\n"


def timeline_rich(tl: "Timeline", width: int | None = None):
    from rich.text import Text
    style = {"F": "blue", "B": "green", "W": "yellow", "": "dim"}
    out = Text(_legend(tl) + "\n")
    for label, cells in timeline_lines(tl, width):
        out.append(label)
        for ch, kind in cells:
            out.append(ch, style=style[kind])
        out.append("\n")
    return out
