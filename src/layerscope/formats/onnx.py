"""ONNX models as a Trace: the same records, costs and tables as a PyTorch model.

Shapes come from onnx's shape inference with data propagation, after the user's values replace
symbolic dims (or whole input shapes); a dim nobody gave stays symbolic, and a node whose shapes are
not all known is listed in coverage rather than counted as zero. Per node: op type, the PyTorch
module path the exporter recorded (metadata ``pkg.torch.onnx.name_scopes``), input and output
shapes and dtypes, attributes with the schema's defaults filled in (a conv's kernel from its weight,
``auto_pad`` resolved into pads), parameters (floating-point initializers, each once however many
nodes read it; integer and 0-d initializers are constants, not parameters), MACs and FLOPs under the
conventions of ``layerscope.costs`` and bytes read and written. Each op type is priced by the cost
registry's ONNX formula (``layerscope.costs.onnx``: the same functions of shapes as the aten ops'; a
registry passed in overrides them); one with none is uncounted in coverage.

The layer tree follows the module paths when the exporter recorded them (a node belongs to its
innermost module); otherwise each node is a layer of its own under the graph.

External data is never read: costs need shapes, not weights. A tensor whose external data file
lies outside the model's folder is refused all the same, as a malformed or hostile model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..costs.registry import (FREE, CostRegistry, NodeCall, OpCost, ShapeUnknown, default_registry,
                              onnx_key)
from ..errors import RegistryError
from ..trace import FORWARD, PRODUCER_INPUT, PRODUCER_STATE, PRODUCER_UNKNOWN, Costs, OpEvent, Trace, Window
from .onnx_layers import (GraphValues, LayerTree, consumers_of, layer_records, layer_tree, numel as _numel, peak,
                          preorder)
# load_onnx, infer_shapes, type_shape and with_input_shapes are also reached from here, as before the split
from .onnx_load import infer_shapes, load_onnx, node_attributes, type_shape, value_dtype, with_input_shapes

__all__ = ["NodeRecord", "OnnxGraph", "load_onnx", "onnx_trace", "infer_shapes", "type_shape", "with_input_shapes"]


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One ONNX node. Shapes hold ints, or strings for symbolic dims; None when unknown."""

    index: int
    name: str
    op_type: str
    domain: str
    module: str | None                     # the PyTorch module path the exporter recorded
    inputs: tuple[tuple[str, tuple | None, str], ...]    # (value name, shape, dtype)
    outputs: tuple[tuple[str, tuple | None, str], ...]
    attributes: dict
    params: int                            # parameters first read by this node
    param_bytes: int
    costs: Costs
    status: str                            # "counted", "free", "uncounted", "unknown shape"

    @property
    def bytes_read(self) -> int:
        return self.costs.bytes_read

    @property
    def bytes_written(self) -> int:
        return self.costs.bytes_written


@dataclass(frozen=True)
class OnnxGraph:
    """What the ONNX path adds to a Report: the nodes and graph-level figures (plain records; their
    table, CSV and JSON views are layerscope.reports.onnx.OnnxNodes, which the Report holds)."""

    nodes: tuple[NodeRecord, ...]
    opset: int
    histogram: dict[str, int]              # op type -> count
    peak_activation_bytes: int | None      # liveness over the node order; None when a size is unknown
    unknown_shapes: tuple[str, ...]        # values whose shape could not be inferred
    symbolic_dims: tuple[str, ...] = ()


# ---- costs -------------------------------------------------------------------------------------

def node_costs(op_type: str, ins: list, outs: list, attrs: dict, registry: CostRegistry | None = None,
               domain: str = "") -> tuple[str, OpCost]:
    """(status, cost) of one node from its input and output shapes (None: unknown), priced by the
    registry's ONNX formulas (``layerscope.costs.onnx``, the same functions of shapes as the aten
    ops'): "free"; "counted"; "unknown shape" where its formula needs a shape inference left unknown;
    "uncounted" where no formula covers the op type (or this node), never a zero."""
    fn = (default_registry() if registry is None else registry).onnx.lookup(op_type, domain)
    if fn is None:
        return "uncounted", _ZERO
    if fn is FREE:
        return "free", _ZERO
    try:
        cost = fn(NodeCall(op_type, ins, outs, attrs, domain))
    except ShapeUnknown:
        return "unknown shape", _ZERO
    if cost is None:
        return "uncounted", _ZERO
    if not isinstance(cost, OpCost):
        raise RegistryError(f"the cost formula of ONNX op type {onnx_key(op_type, domain)} returned "
                            f"{type(cost).__name__}, not an OpCost (or None)")
    return "counted", cost


_ZERO = OpCost(0, 0, 0, 0)


# ---- the trace ---------------------------------------------------------------------------------

@dataclass(slots=True)
class _NodePass:
    """What the walk over the nodes gathers: their records and ops, who makes each value, which node
    first reads each parameter and which layers read it, and the values of unknown shape."""

    nodes: list[NodeRecord] = field(default_factory=list)
    ops: list[OpEvent] = field(default_factory=list)
    producer: dict[str, int] = field(default_factory=dict)
    param_first: dict[str, int] = field(default_factory=dict)     # initializer -> first node reading it
    param_users: dict[str, set] = field(default_factory=dict)
    unknown: dict[str, None] = field(default_factory=dict)


def _priced(node, v: GraphValues, consts: dict, opset: int, registry: CostRegistry):
    """(status, MACs, FLOPs, the formula's cost, attributes to show) of one node; If, Loop and Scan
    from their subgraphs."""
    attrs = node_attributes(node, opset, v.shapes)
    ins = [v.shapes.get(n) if n else None for n in node.input]
    outs = [v.shapes.get(n) for n in node.output]
    cost = _ZERO
    if node.op_type in ("If", "Loop", "Scan"):
        status, macs, flops, extra = _control_flow(node, attrs, v.shapes, consts, opset, registry)
        attrs = {key: val for key, val in attrs.items() if not hasattr(val, "node")} | extra
    else:
        status, cost = node_costs(node.op_type, ins, outs, attrs, registry, node.domain)
        macs, flops = cost.macs, cost.flops
    return status, macs, flops, cost, attrs


def _moved(node, v: GraphValues, status: str, cost: OpCost, macs: int, flops: int) -> tuple[str, Costs]:
    """The node's status and Costs with bytes read and written: a counted node whose value sizes are
    not all known becomes "unknown shape", counted as zero."""
    r_bytes = [v.nbytes(n) for n in node.input if n]
    w_bytes = [v.nbytes(n) for n in node.output if n]
    if status == "free":
        read = written = 0
    elif status == "counted" and None not in r_bytes + w_bytes:
        # every input read and every output written once, unless the formula says otherwise
        read = sum(r_bytes) if cost.bytes_read is None else cost.bytes_read
        written = sum(w_bytes) if cost.bytes_written is None else cost.bytes_written
    elif status == "counted":
        status = "unknown shape"
        read = written = 0
        macs = flops = 0
    else:
        read = written = 0
    return status, Costs(macs, flops, read, written)


def _producers(node, v: GraphValues, producer: dict) -> tuple[int, ...]:
    prods = []
    for n in node.input:
        if not n:
            continue
        if n in producer:
            prods.append(producer[n])
        elif n in v.graph_inputs:
            prods.append(PRODUCER_INPUT)
        elif n in v.inits:
            prods.append(PRODUCER_STATE)
        else:
            prods.append(PRODUCER_UNKNOWN)
    return tuple(prods)


def _window(node, attrs: dict) -> Window | None:
    if node.op_type in ("Conv", "ConvTranspose", "MaxPool", "AveragePool") and "kernel_shape" in attrs:
        nd = len(attrs["kernel_shape"])
        return Window("tconv" if node.op_type == "ConvTranspose" else "conv", tuple(attrs["kernel_shape"]),
                      tuple(attrs["strides"]), tuple(attrs["pads"][:nd]), tuple(attrs["dilations"]))
    return None


def _walk_nodes(v: GraphValues, tree: LayerTree, consts: dict, opset: int, registry: CostRegistry) -> _NodePass:
    """Each node's record and op, in node order."""
    acc = _NodePass()
    for k, node in enumerate(v.g.node):
        op = onnx_key(node.op_type, node.domain)
        status, macs, flops, cost, attrs = _priced(node, v, consts, opset, registry)
        for n in list(node.input) + list(node.output):
            if n and _numel(v.shapes.get(n)) is None:
                acc.unknown[n] = None
        status, costs = _moved(node, v, status, cost, macs, flops)
        params = pbytes = 0
        for n in node.input:
            if n and v.is_param(n):
                acc.param_users.setdefault(n, set()).add(tree.node_layer[k])
                if n not in acc.param_first:
                    acc.param_first[n] = k
                    params += _numel(v.shapes[n]) or 0
                    pbytes += v.nbytes(n) or 0
        scopes = tree.scoped[k]
        acc.nodes.append(NodeRecord(
            index=k, name=node.name or f"{node.op_type}_{k}", op_type=node.op_type, domain=node.domain,
            module=scopes[0][-1] if scopes else None,
            inputs=tuple((n, v.shapes.get(n), v.dtypes.get(n, ("?", 0))[0]) for n in node.input),
            outputs=tuple((n, v.shapes.get(n), v.dtypes.get(n, ("?", 0))[0]) for n in node.output),
            attributes=attrs, params=params, param_bytes=pbytes, costs=costs, status=status))
        acc.ops.append(OpEvent(index=k, op=f"onnx.{op}" + (" (unknown shape)" if status == "unknown shape" else ""),
                               layer=tree.node_layer[k], phase=FORWARD,
                               status="uncounted" if status == "unknown shape" else status, costs=costs,
                               producers=_producers(node, v, acc.producer), window=_window(node, attrs)))
        for n in node.output:
            if n:
                acc.producer[n] = k
    return acc


def onnx_trace(src, input_shapes: dict | None = None,
               costs: CostRegistry | None = None) -> tuple[Trace, OnnxGraph]:
    """The Trace of an ONNX model (path or ModelProto) and its node-level view; ``costs``: the registry
    whose ONNX formulas price the nodes (None: the default one)."""
    registry = default_registry() if costs is None else costs
    custom = None if costs is None else costs.name
    model = load_onnx(src)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    inferred = infer_shapes(with_input_shapes(model, input_shapes))
    g = inferred.graph
    shapes: dict[str, tuple | None] = {}
    dtypes: dict[str, tuple[str, int]] = {}
    consts: dict[str, Any] = {}                          # small integer constants' values (trip counts)
    _collect_shapes(g, shapes, dtypes, consts)
    inits = {t.name: t for t in g.initializer}
    v = GraphValues(g, shapes, dtypes, inits, [i.name for i in g.input if i.name not in inits])
    tree = layer_tree(g)
    walk = _walk_nodes(v, tree, consts, opset, registry)
    consumers = consumers_of(g)
    layers, layer_outputs = layer_records(v, tree, walk.nodes, walk.producer, walk.param_first,
                                          walk.param_users, consumers)
    layers, layer_outputs, ops = preorder(tree.recs, layers, layer_outputs, walk.ops)
    return _trace_of(model, v, tree, walk, layers, layer_outputs, ops, opset, custom), \
        _graph_of(v, walk, consumers, opset)


def _trace_of(model, v: GraphValues, tree: LayerTree, walk: _NodePass, layers: list, layer_outputs: list,
              ops: list, opset: int, custom: str | None) -> Trace:
    pf, users, shapes = walk.param_first, walk.param_users, v.shapes
    total_params = sum(_numel(shapes[n]) or 0 for n in pf)
    param_bytes = sum(v.nbytes(n) or 0 for n in pf)
    shared = sum(_numel(shapes[n]) or 0 for n in pf if len(users[n]) > 1)
    options = {"format": "onnx", "opset": opset}
    merged = _merged_initializers(model, tree.recs, users, shapes) if tree.use_scopes else None
    if merged:
        options["merged_initializers"] = merged
    if custom is not None:         # as analyze(costs=...) records it: the numbers follow another registry
        options["costs"] = custom
    return Trace(
        model_name=v.g.name or "onnx", layers=tuple(layers), ops=tuple(ops), layer_outputs=tuple(layer_outputs),
        param_numel=total_params, trainable_numel=total_params, shared_numel=shared, param_bytes=param_bytes,
        buffer_numel=0, buffer_bytes=0, input_bytes=sum(v.nbytes(n) or 0 for n in v.graph_inputs),
        output_bytes=sum(v.nbytes(o.name) or 0 for o in v.g.output), options=options)


def _graph_of(v: GraphValues, walk: _NodePass, consumers: dict, opset: int) -> OnnxGraph:
    hist: dict[str, int] = {}
    for n in walk.nodes:
        hist[n.op_type] = hist.get(n.op_type, 0) + 1
    symbolic = sorted({d for s in v.shapes.values() if s for d in s if isinstance(d, str)})
    return OnnxGraph(nodes=tuple(walk.nodes), opset=opset,
                     histogram=dict(sorted(hist.items(), key=lambda kv: -kv[1])),
                     peak_activation_bytes=peak(v, consumers),
                     unknown_shapes=tuple(walk.unknown), symbolic_dims=tuple(symbolic))


# torch.onnx.export(dynamo=True) runs onnxscript's optimizer, whose DeduplicateInitializersPass (onnx_ir,
# size_limit=1024) replaces initializers of equal dtype, shape and values of at most this many elements
# by one: two LayerNorms still at their initial weights share one initializer in the file
DEDUP_LIMIT = 1024


def _merged_initializers(model, recs, param_users, shapes) -> dict | None:
    """Shared initializers torch's exporter may have merged for being equal: at most DEDUP_LIMIT elements,
    named after one module (``1.weight``), read by another's layer. One module called twice is one layer;
    a tie between two modules of that size looks the same in the file, hence "may" in the report."""
    if model.producer_name != "pytorch":
        return None
    names, numel, example = [], 0, None
    for name, users in param_users.items():
        n = _numel(shapes.get(name)) or 0
        owner = name.rsplit(".", 1)[0] if "." in name else None
        if len(users) < 2 or n > DEDUP_LIMIT or owner is None:
            continue
        others = [recs[u]["path"] for u in sorted(users)
                  if not (recs[u]["path"] == owner or recs[u]["path"].startswith(owner + "."))]
        if others:
            names.append(name)
            numel += n
            example = example or (name, others[0])
    if not names:
        return None
    return {"initializers": len(names), "params": numel, "example": list(example)}


def _collect_shapes(g, shapes: dict, dtypes: dict, consts: dict) -> None:
    """Shapes and dtypes of every value of a graph and, recursively, of its subgraphs (If branches,
    Loop and Scan bodies); the values of small integer initializers and Constants."""
    import onnx
    from onnx import numpy_helper
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        s, et = type_shape(vi.type)
        if s is not None or vi.name not in shapes:
            shapes[vi.name] = s
        if et:
            dtypes[vi.name] = value_dtype(et)
    tensors = [(t.name, t) for t in g.initializer]
    tensors += [(n.output[0], a.t) for n in g.node if n.op_type == "Constant" and n.output
                for a in n.attribute if a.name == "value"]
    for name, t in tensors:
        shapes[name] = tuple(t.dims)
        dtypes[name] = value_dtype(t.data_type)
        if t.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32, onnx.TensorProto.BOOL) and \
                math.prod(t.dims) <= 16 and t.data_location != onnx.TensorProto.EXTERNAL:
            consts[name] = numpy_helper.to_array(t)
    for n in g.node:
        for a in n.attribute:
            for sub in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                _collect_shapes(sub, shapes, dtypes, consts)


def _graph_costs(g, shapes: dict, consts: dict, opset: int, registry: CostRegistry) -> tuple[Costs, int]:
    """Costs of every node of a (sub)graph, and how many nodes could not be counted."""
    total, missed = Costs(), 0
    for node in g.node:
        attrs = node_attributes(node, opset, shapes)
        if node.op_type in ("If", "Loop", "Scan"):
            status, macs, flops, _ = _control_flow(node, attrs, shapes, consts, opset, registry)
        else:
            status, cost = node_costs(node.op_type, [shapes.get(n) if n else None for n in node.input],
                                      [shapes.get(n) for n in node.output], attrs, registry, node.domain)
            macs, flops = cost.macs, cost.flops
        if status not in ("counted", "free"):
            missed += 1
            continue
        if status == "counted":
            total = total + Costs(macs, flops)
    return total, missed


def _control_flow(node, attrs: dict, shapes: dict, consts: dict, opset: int, registry: CostRegistry):
    """(status, MACs, FLOPs, attributes to show) of If, Loop and Scan from their subgraphs. If: the
    costlier branch (an upper bound; both are shown). Loop: the body times the trip count when the
    count is a constant (else uncounted, with the per-iteration cost shown). Scan: the body times
    the scanned axis's length."""
    graphs = {a.name: a.g for a in node.attribute if a.HasField("g")}
    if node.op_type == "If":
        then, t_miss = _graph_costs(graphs["then_branch"], shapes, consts, opset, registry)
        other, e_miss = _graph_costs(graphs["else_branch"], shapes, consts, opset, registry)
        big = max(then, other, key=lambda c: (c.flops, c.macs))
        extra = {"then_macs": then.macs, "then_flops": then.flops, "else_macs": other.macs,
                 "else_flops": other.flops, "counted_branch": "then" if big is then else "else"}
        return ("counted" if not (t_miss or e_miss) else "uncounted"), big.macs, big.flops, extra
    body, miss = _graph_costs(graphs["body"], shapes, consts, opset, registry)
    trips = None
    if node.op_type == "Loop":
        m = consts.get(node.input[0]) if node.input and node.input[0] else None
        trips = int(m.reshape(-1)[0]) if m is not None and m.size == 1 else None
    else:                                                  # Scan: the first scan input's axis
        n_scan = len(node.input) - int(attrs.get("num_scan_inputs", 0))
        first = node.input[n_scan] if n_scan < len(node.input) else None
        shape = shapes.get(first) if first else None
        axes = attrs.get("scan_input_axes") or [0]
        trips = shape[axes[0]] if shape is not None and isinstance(shape[axes[0]], int) else None
    extra = {"iteration_macs": body.macs, "iteration_flops": body.flops, "trip_count": trips}
    if trips is None or miss:
        return "uncounted", 0, 0, extra
    return "counted", body.macs * trips, body.flops * trips, extra
