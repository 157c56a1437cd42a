"""CSV of the layer rows (one row per module call; numbers unformatted)."""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Any

from .columns import rf_str

if TYPE_CHECKING:
    from ..report import Report

FIELDS = ("index", "path", "type", "depth", "call_index", "parent", "input_shapes", "output_shapes",
          "num_params", "subtree_params", "trainable_params", "kernel_size", "macs", "flops",
          "bytes_read", "bytes_written", "self_macs", "self_flops", "backward_macs", "backward_flops",
          "uncounted_ops", "receptive_field")


def _shapes(specs) -> str:
    return ";".join("x".join(str(d) for d in s.shape) for s in specs)


def layer_row(r) -> dict[str, Any]:
    return {
        "index": r.index, "path": r.path, "type": r.type, "depth": r.depth, "call_index": r.call_index,
        "parent": "" if r.parent is None else r.parent, "input_shapes": _shapes(r.inputs),
        "output_shapes": _shapes(r.outputs), "num_params": r.num_params,
        "subtree_params": r.subtree_params, "trainable_params": r.trainable_params,
        "kernel_size": "x".join(map(str, r.kernel_size)) if r.kernel_size else "",
        "macs": r.forward_total.macs, "flops": r.forward_total.flops,
        "bytes_read": r.forward_total.bytes_read, "bytes_written": r.forward_total.bytes_written,
        "self_macs": r.forward.macs, "self_flops": r.forward.flops,
        "backward_macs": r.backward_total.macs, "backward_flops": r.backward_total.flops,
        "uncounted_ops": r.uncounted_ops,
        "receptive_field": "" if r.receptive_field is None else rf_str(r.receptive_field),
    }


def csv_text(fields, rows) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    w.writeheader()
    for row in rows:
        w.writerow(row)
    return buf.getvalue()


def render_csv(rep: "Report") -> str:
    return csv_text(FIELDS, (layer_row(r) for r in rep.layers))
