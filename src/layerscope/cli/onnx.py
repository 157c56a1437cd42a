"""`layerscope onnx` (an ONNX model's node table) and `onnx-tile` (its matmuls rewritten into blocks)."""

from __future__ import annotations

import argparse
import sys

from .common import say, status, write_output
from .flags import given


def run_onnx_tile(ns: argparse.Namespace) -> int:
    from ..api import onnx_tile
    from ..errors import InputError
    from ..options import TileOptions

    if len(ns.block) != 3:
        raise InputError(f"--block needs three sizes M,K,N, got {ns.block}")
    # the flags of TileOptions' fields, as given; those the command line writes as text, parsed here
    opts = TileOptions(**{**given(ns, TileOptions), "block": tuple(ns.block), "ops": tuple(ns.ops.split(",")),
                          "nodes": ns.nodes.split(",") if ns.nodes else None, "input_shapes": _input_shapes(ns)})
    with status(f"tiling {ns.file}", ns):
        res = onnx_tile(ns.file, options=opts)
    res.save(ns.out)
    lines = [f"tiled {len(res.tiled)} node(s) into {res.blocks} blocks of at most "
             f"{'x'.join(str(b) for b in ns.block)}: {ns.out}"]
    lines += [f"skipped {name}: {why}" for name, why in res.skipped]
    if res.verified:
        v = res.verified
        lines.append(f"onnxruntime, {v['runs']} random inputs: max abs error {v['max_abs_error']:.3g}, "
                     f"MSE {v['mse']:.3g}")
    for line in lines:
        say(line)
    return 0


def _input_shapes(ns: argparse.Namespace) -> dict | None:
    """--input NAME=DIMS items: an input's shape, or a symbolic dim's value."""
    from ..errors import InputError

    shapes: dict = {}
    inputs: set[str] | None = None       # the graph's input names, read once when a single value needs them
    for item in ns.input_shapes or []:
        name, sep, dims = item.partition("=")
        try:
            vals = [int(d) for d in dims.split(",")] if sep else None
        except ValueError:
            vals = None
        if not vals or not name:
            raise InputError(f"--input {item!r}: expected NAME=DIMS such as x=1,3,224,224 or batch=8")
        if len(vals) == 1 and inputs is None:
            from ..formats.onnx import load_onnx
            inputs = {i.name for i in load_onnx(ns.file).graph.input}
        # one value for a name that is not a graph input: a symbolic dim's value
        shapes[name] = vals[0] if len(vals) == 1 and name not in inputs else tuple(vals)
    return shapes or None


def run_onnx(ns: argparse.Namespace) -> int:
    from ..api import analyze_onnx

    with status(f"analysing {ns.file}", ns):
        rep = analyze_onnx(ns.file, _input_shapes(ns))
    if ns.format == "json":
        return write_output(ns, rep.to_json())
    if ns.format == "csv":
        return write_output(ns, rep.graph.to_csv(ns.sort, ns.top))
    if ns.format == "html":
        return write_output(ns, rep.to_html())
    if ns.output is None and sys.stdout.isatty():       # both tables fitted to the terminal
        rep.print(depth=ns.depth, fold=not ns.expand)
        print()
        rep.graph.print(ns.sort, ns.top)
        return 0
    return write_output(ns, rep.table(depth=ns.depth, fold=not ns.expand) + "\n" + rep.graph.table(ns.sort, ns.top))
