"""Entry points for ONNX models: ``analyze_onnx()`` (the same Report as a PyTorch model, with the
graph's own view) and ``onnx_tile()`` (a rewrite into block matmuls)."""

from __future__ import annotations

import importlib.util

from ..costs import CostRegistry
from ..errors import InputError
from ..options import OnnxOptions, TileOptions, entry_options
from ..reports.onnx import OnnxNodes
from ..reports.summary import Report

__all__ = ["analyze_onnx", "onnx_tile"]


def analyze_onnx(model, input_shapes: dict | None = None, costs=None, *,
                 options: OnnxOptions | None = None) -> Report:
    """Analyse an ONNX model (a path or an ``onnx.ModelProto``) into the same Report as a PyTorch
    model: layers follow the module paths the exporter recorded (else one layer per node), costs
    follow the same conventions, and ``report.graph`` holds the nodes (attributes with defaults,
    shapes, params, MACs, FLOPs, bytes read and written), the op histogram and the peak activation
    memory. ``input_shapes``: ``{input name: shape}`` and/or ``{symbolic dim: value}``; dims left
    symbolic keep their names, and nodes they make unknown are listed in coverage. ``costs``: a
    ``layerscope.costs.CostRegistry`` whose ONNX op types (``reg.onnx``) price the nodes instead of the
    default one's (``default_registry().copy()`` then ``reg.onnx.register``/``override``); an op type it
    has no formula for is uncounted in coverage. ``options=OnnxOptions(...)`` may give both instead
    (not both ways). Needs the ``onnx`` extra; external data is never read."""
    opts, _ = entry_options(OnnxOptions, options, {}, input_shapes=input_shapes, costs=costs)
    if opts.costs is not None and not isinstance(opts.costs, CostRegistry):
        raise InputError(f"costs must be a layerscope.costs.CostRegistry (default_registry().copy()), got "
                         f"{type(opts.costs).__name__}")
    if importlib.util.find_spec("onnx") is None:
        raise InputError("ONNX analysis needs the onnx package: pip install 'layerscope[onnx]'")
    from ..formats.onnx import onnx_trace
    trace, graph = onnx_trace(model, opts.input_shapes, opts.costs)
    return Report(trace, graph=OnnxNodes.of(graph))


def onnx_tile(model, block=(64, 64, 64), ops=("Gemm", "MatMul"), nodes=None, input_shapes=None,
              verify: bool = False, *, options: TileOptions | None = None):
    """Rewrite every Gemm/MatMul (or the ``nodes`` named) of an ONNX model into Split + block
    Gemm/MatMul + Sum + Concat of at most ``block`` = (M, K, N), the bias added once; the result is
    checked with onnx.checker. Returns a TileResult (``.model``, ``.tiled``, ``.skipped``,
    ``.blocks``, ``.save(path)``); with ``verify=True`` its ``.verified`` holds onnxruntime's
    comparison with the original on random inputs (max abs error, MSE). ``options=TileOptions(...)``
    may give the options instead (not both ways)."""
    from ..formats.onnx_rewrite import onnx_tile as tile, verify_tiling
    opts, _ = entry_options(TileOptions, options, {}, block=block, ops=ops, nodes=nodes,
                            input_shapes=input_shapes, verify=verify)
    res = tile(model, block=opts.block, ops=tuple(opts.ops), nodes=opts.nodes, input_shapes=opts.input_shapes)
    if opts.verify:
        res.verified = verify_tiling(model, res, input_shapes=opts.input_shapes)
    return res
