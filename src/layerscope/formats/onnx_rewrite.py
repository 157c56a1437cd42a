"""Tiling rewrite: every matching Gemm/MatMul becomes blocks of at most M x K x N.

A node computing Y[M, N] = A[M, K] @ B[K, N] becomes
  Split A along M and K, Split B along K and N      (sizes that are not multiples of the block give a
                                                     smaller last piece)
  Y_ij = Sum_k (A_ik @ B_kj)                         (a Gemm or MatMul per block; Sum when K has > 1 piece)
  Y    = Concat_i (Concat_j Y_ij)                    (along N, then along M)
  Y   += C                                           (a Gemm's bias, added once; beta applied to it)
MatMul keeps its leading batch dims: blocks split the last two axes of each operand. The rewritten
model passes onnx.checker; ``verify_tiling`` runs both models in onnxruntime on the same random
inputs and reports the largest absolute difference and the mean squared error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InputError

__all__ = ["TileResult", "onnx_tile", "verify_tiling"]


@dataclass
class TileResult:
    model: Any                                        # onnx.ModelProto
    tiled: list[str] = field(default_factory=list)   # node names rewritten
    skipped: list[tuple[str, str]] = field(default_factory=list)   # (node, why)
    blocks: int = 0                                   # block products written
    verified: dict | None = None                      # verify_tiling's figures, when asked
    checked: bool = False                             # passed onnx.checker (not run when the original fails it)

    def save(self, path: str) -> None:
        import onnx
        onnx.save(self.model, path)


def _pieces(n: int, b: int) -> list[int]:
    return [b] * (n // b) + ([n % b] if n % b else [])


class _Builder:
    def __init__(self, prefix: str, opset: int) -> None:
        self.prefix, self.opset = prefix, opset
        self.nodes: list = []
        self.inits: list = []
        self.k = 0

    def name(self, what: str) -> str:
        self.k += 1
        return f"{self.prefix}/{what}_{self.k}"

    def split(self, x: str, axis: int, sizes: list[int]) -> list[str]:
        from onnx import helper, numpy_helper
        if len(sizes) == 1:
            return [x]
        outs = [self.name("split") for _ in sizes]
        if self.opset >= 13:
            s = self.name("sizes")
            self.inits.append(numpy_helper.from_array(np.array(sizes, dtype=np.int64), s))
            self.nodes.append(helper.make_node("Split", [x, s], outs, axis=axis, name=self.name("Split")))
        else:
            self.nodes.append(helper.make_node("Split", [x], outs, axis=axis, split=sizes, name=self.name("Split")))
        return outs

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        from onnx import helper
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(op), **attrs))
        return out


def _static(shape) -> bool:
    return shape is not None and all(isinstance(d, int) and d > 0 for d in shape)


@dataclass(frozen=True)
class _Layout:
    """Where M, K and N lie in a node's two operands, and a Gemm's transposes and scales."""

    m_ax: int
    ka_ax: int
    kb_ax: int
    n_ax: int
    ta: int = 0
    tb: int = 0
    alpha: float = 1.0
    beta: float = 1.0


def _layout(node, a: tuple, b: tuple) -> _Layout:
    from onnx import helper
    attrs = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    if node.op_type == "Gemm":
        ta, tb = int(attrs.get("transA", 0)), int(attrs.get("transB", 0))
        m_ax, ka_ax = (1, 0) if ta else (0, 1)
        kb_ax, n_ax = (1, 0) if tb else (0, 1)
        return _Layout(m_ax, ka_ax, kb_ax, n_ax, ta, tb, float(attrs.get("alpha", 1.0)),
                       float(attrs.get("beta", 1.0)))
    return _Layout(len(a) - 2, len(a) - 1, len(b) - 2, len(b) - 1)


def _tile_node(node, name: str, a: tuple, b: tuple, opset: int, block: tuple[int, int, int]) -> tuple[_Builder, int]:
    """The nodes and initializers replacing one Gemm or MatMul whose operands are static matrices, and
    how many block products they hold."""
    from onnx import helper
    bm, bk, bn = block
    lay = _layout(node, a, b)
    bld = _Builder(name, opset)
    M, K, N = a[lay.m_ax], a[lay.ka_ax], b[lay.n_ax]
    ms, ks, ns = _pieces(M, bm), _pieces(K, bk), _pieces(N, bn)
    a_rows = bld.split(node.input[0], lay.m_ax, ms)
    a_blocks = [bld.split(r, lay.ka_ax, ks) for r in a_rows]           # [i][k]
    b_rows = bld.split(node.input[1], lay.kb_ax, ks)
    b_blocks = [bld.split(r, lay.n_ax, ns) for r in b_rows]            # [k][j]
    rows, blocks = [], 0
    for i in range(len(ms)):
        cols = []
        for j in range(len(ns)):
            parts = []
            for k in range(len(ks)):
                if node.op_type == "Gemm":
                    extra = {"transA": lay.ta, "transB": lay.tb}
                    if lay.alpha != 1.0:
                        extra["alpha"] = lay.alpha
                    parts.append(bld.node("Gemm", [a_blocks[i][k], b_blocks[k][j]], **extra))
                else:
                    parts.append(bld.node("MatMul", [a_blocks[i][k], b_blocks[k][j]]))
                blocks += 1
            cols.append(parts[0] if len(parts) == 1 else bld.node("Sum", parts))
        rows.append(cols[0] if len(cols) == 1 else bld.node("Concat", cols, axis=-1))
    y = rows[0] if len(rows) == 1 else bld.node("Concat", rows, axis=-2)
    c = node.input[2] if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2] else None
    if c is not None:
        if lay.beta != 1.0:
            from onnx import numpy_helper
            s = bld.name("beta")
            bld.inits.append(numpy_helper.from_array(np.array(lay.beta, dtype=np.float32), s))
            c = bld.node("Mul", [c, s])
        y = bld.node("Add", [y, c])
    bld.nodes.append(helper.make_node("Identity", [y], [node.output[0]], name=bld.name("Identity")))
    return bld, blocks


def _value_shapes(src, input_shapes: dict | None) -> dict[str, Any]:
    """Every value's inferred shape (the user's input shapes applied) and each initializer's."""
    from .onnx_load import infer_shapes, type_shape, with_input_shapes
    inferred = infer_shapes(with_input_shapes(src, input_shapes))
    shapes: dict[str, Any] = {}
    for vi in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        shapes[vi.name] = type_shape(vi.type)[0]
    for t in src.graph.initializer:
        shapes[t.name] = tuple(t.dims)
    return shapes


def onnx_tile(model, block: tuple[int, int, int] = (64, 64, 64), ops=("Gemm", "MatMul"), nodes=None,
              input_shapes: dict | None = None) -> TileResult:
    """Rewrite every ``ops`` node (or only those named in ``nodes``) into M x K x N blocks; returns a
    TileResult with the new ModelProto (checked by onnx.checker when the original passes it), the
    nodes tiled and those skipped with the reason (a dynamic or 1-D operand)."""
    import onnx

    from .onnx_load import load_onnx

    if len(block) != 3 or any(int(b) < 1 for b in block):
        raise InputError(f"block must be three positive sizes (M, K, N), got {block!r}")
    sizes = tuple(int(b) for b in block)
    src = load_onnx(model)
    opset = next((o.version for o in src.opset_import if o.domain in ("", "ai.onnx")), 0)
    shapes = _value_shapes(src, input_shapes)
    wanted = set(nodes) if nodes is not None else None
    out = onnx.ModelProto()
    out.CopyFrom(src)
    g = out.graph
    result = TileResult(out)
    new_nodes = []
    for idx, node in enumerate(src.graph.node):
        name = node.name or f"{node.op_type}_{idx}"
        if node.op_type not in ops or (wanted is not None and name not in wanted) or node.domain not in ("", "ai.onnx"):
            new_nodes.append(node)
            continue
        a, b = shapes.get(node.input[0]), shapes.get(node.input[1])
        if not (_static(a) and _static(b)) or len(a) < 2 or len(b) < 2:
            result.skipped.append((name, f"operand shapes {a} and {b} are not static matrices"))
            new_nodes.append(node)
            continue
        bld, blocks = _tile_node(node, name, a, b, opset, sizes)
        result.blocks += blocks
        new_nodes += bld.nodes
        g.initializer.extend(bld.inits)
        result.tiled.append(name)
    del g.node[:]
    g.node.extend(new_nodes)
    if wanted is not None:
        missing = wanted - set(result.tiled) - {n for n, _ in result.skipped}
        if missing:
            raise InputError(f"no {'/'.join(ops)} node named {sorted(missing)}")
    return _checked(src, out, result)


def _checked(src, out, result: TileResult) -> TileResult:
    """The result marked checked when the tiled model passes onnx.checker; an error when it fails where
    the original passes."""
    import onnx
    try:
        onnx.checker.check_model(src)
    except onnx.checker.ValidationError:
        return result                     # the original fails already: nothing to blame on tiling
    try:
        onnx.checker.check_model(out)
    except onnx.checker.ValidationError as e:
        raise InputError(f"the tiled model does not pass onnx.checker: {e}") from None
    result.checked = True
    return result


def _random_feeds(model, input_shapes: dict | None, rng) -> dict[str, np.ndarray]:
    import onnx
    from .onnx_load import type_shape
    init = {t.name for t in model.graph.initializer}
    feeds = {}
    for i in model.graph.input:
        if i.name in init:
            continue
        shape, et = type_shape(i.type)
        given = (input_shapes or {}).get(i.name)
        dims = list(given) if given is not None else [d if isinstance(d, int) and d > 0 else
                                                      int((input_shapes or {}).get(d, 1)) for d in (shape or [])]
        dt = onnx.helper.tensor_dtype_to_np_dtype(et)
        if np.issubdtype(dt, np.floating):
            feeds[i.name] = rng.standard_normal(dims).astype(dt)
        else:
            feeds[i.name] = rng.integers(0, 2, size=dims).astype(dt)
    return feeds


def verify_tiling(original, tiled, input_shapes: dict | None = None, runs: int = 3, seed: int = 0) -> dict:
    """Run both models in onnxruntime (CPU) on the same random inputs: {"max_abs_error", "mse",
    "runs"} over every output of every run."""
    import onnxruntime as ort
    from .onnx_load import load_onnx
    a = load_onnx(original)
    b = load_onnx(tiled.model if isinstance(tiled, TileResult) else tiled)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL   # compare as written
    try:
        sa = ort.InferenceSession(a.SerializeToString(), opts, providers=["CPUExecutionProvider"])
        sb = ort.InferenceSession(b.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    except Exception as e:     # onnxruntime's own error types
        raise InputError(f"onnxruntime cannot load the model to verify it: {str(e).splitlines()[0][-300:]}") \
            from None
    rng = np.random.default_rng(seed)
    worst, sq, count = 0.0, 0.0, 0
    for _ in range(runs):
        feeds = _random_feeds(a, input_shapes, rng)
        for x, y in zip(sa.run(None, feeds), sb.run(None, feeds)):
            d = np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64)
            worst = max(worst, float(np.abs(d).max()) if d.size else 0.0)
            sq += float((d * d).sum())
            count += d.size
    return {"max_abs_error": worst, "mse": sq / count if count else 0.0, "runs": runs}
