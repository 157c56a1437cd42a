"""LatencyReport: per module call, forward (and backward) time, inclusive and self, over repeats."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, TextIO

from .analyses.latency import Timing
from .render.output import dataframe, print_report, write_text

__all__ = ["LatencyLayer", "LatencyReport"]


@dataclass(frozen=True, slots=True)
class LatencyLayer:
    """One module call. Times in seconds; costs of its whole subtree from the capture core."""

    index: int
    path: str
    type: str
    depth: int
    call_index: int
    parent: int | None
    children: tuple[int, ...]
    params: int                    # unique parameters of the module's subtree
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    forward: Timing                # inclusive: the call and everything nested in it
    forward_self: Timing           # inclusive minus the direct children's, per repeat
    backward: Timing | None
    backward_self: Timing | None
    flops: int                     # forward FLOPs of the subtree
    bytes_moved: int               # forward bytes read + written of the subtree
    backward_flops: int = 0
    backward_bytes: int = 0

    @property
    def name(self) -> str:
        return self.path or "(root)"

    @property
    def flops_per_second(self) -> float | None:
        """Achieved forward FLOP/s: the subtree's FLOPs over its median inclusive time."""
        return self.flops / self.forward.median if self.forward.median > 0 and self.flops else None

    @property
    def bytes_per_second(self) -> float | None:
        return self.bytes_moved / self.forward.median if self.forward.median > 0 and self.bytes_moved else None

    @property
    def intensity(self) -> float | None:
        """Arithmetic intensity: FLOPs per byte moved (forward)."""
        return self.flops / self.bytes_moved if self.bytes_moved else None


@dataclass(frozen=True)
class LatencyReport:
    model_name: str
    device: str
    options: dict
    layers: tuple[LatencyLayer, ...]
    totals: dict                   # see api.profile
    notes: tuple[str, ...] = ()

    def top(self, k: int = 5, depth: int | None = None, by: str = "forward_self") -> list[LatencyLayer]:
        """The k calls with the largest median ``by`` time (``forward``, ``forward_self``,
        ``backward``, ``backward_self``), optionally only at one depth."""
        rows = [r for r in self.layers if depth is None or r.depth == depth]
        return sorted(rows, key=lambda r: getattr(r, by).median if getattr(r, by) else 0.0, reverse=True)[:k]

    def table(self, depth: int | None = None) -> str:
        from .render.latency import render_latency_text
        return render_latency_text(self, depth)

    def rich_table(self, depth: int | None = None):
        from .render.latency import render_latency_rich
        return render_latency_rich(self, depth)

    def print(self, depth: int | None = None, file: TextIO | None = None) -> None:
        print_report(lambda: self.rich_table(depth), lambda: self.table(depth), file)

    def to_dict(self) -> dict[str, Any]:
        from .render.latency import latency_dict
        return latency_dict(self)

    def to_json(self, path: str | None = None, indent: int | None = 2) -> str:
        return write_text(json.dumps(self.to_dict(), indent=indent), path)

    def to_csv(self, path: str | None = None) -> str:
        from .render.latency import render_latency_csv
        return write_text(render_latency_csv(self), path)

    def to_dataframe(self):
        from .render.latency import latency_row
        return dataframe(latency_row(r) for r in self.layers)

    def __str__(self) -> str:
        return self.table()

    def __repr__(self) -> str:
        t = self.totals
        return (f"<LatencyReport {self.model_name}: forward {t['forward_plain'] * 1e3:.3f} ms "
                f"({len(self.layers)} calls, {self.options['repeats']} repeats on {self.device})>")
