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

import ast
import math
from dataclasses import dataclass
from typing import Any

from ..costs.registry import (FREE, CostRegistry, NodeCall, OpCost, ShapeUnknown, default_registry,
                              onnx_key)
from ..errors import RegistryError
from ..trace import (FORWARD, PRODUCER_INPUT, PRODUCER_STATE, PRODUCER_UNKNOWN, Costs, LayerRecord, OpEvent,
                     ParamSpec, TensorSpec, Trace, Window)
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

def _numel(shape) -> int | None:
    if shape is None or any(not isinstance(d, int) for d in shape):
        return None
    return math.prod(shape)


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

def _scopes(node) -> tuple[list[str], list[str]] | None:
    meta = {p.key: p.value for p in node.metadata_props}
    raw = meta.get("pkg.torch.onnx.name_scopes")
    if not raw:
        return None
    try:
        scopes = ast.literal_eval(raw)
        classes = ast.literal_eval(meta.get("pkg.torch.onnx.class_hierarchy", "[]"))
    except (ValueError, SyntaxError):
        return None
    scopes, classes = list(scopes)[:-1], list(classes)[:-1]      # the last entry is the op itself
    if not scopes or scopes[0] != "":
        scopes = [""] + scopes
        classes = [""] + classes
    return scopes, classes


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

    def nbytes(name: str) -> int | None:
        n = _numel(shapes.get(name))
        return None if n is None else n * dtypes.get(name, ("", 0))[1]

    def is_param(name: str) -> bool:
        # floating-point initializers with at least one dim; 0-d ones are the exporter's scalar constants
        t = inits.get(name)
        return t is not None and len(t.dims) > 0 and dtypes[name][0].startswith(("float", "bfloat", "complex"))

    graph_inputs = [i.name for i in g.input if i.name not in inits]
    # ---- layers: module scopes, or one per node
    scoped = [_scopes(n) for n in g.node]
    use_scopes = any(s is not None for s in scoped)
    layer_of_path: dict[str, int] = {"": 0}
    recs: list[dict] = [{"path": "", "type": g.name or "graph", "parent": None, "children": [], "depth": 0}]

    def layer_for(scopes: list[str], classes: list[str]) -> int:
        parent = 0
        for depth, (p, cls) in enumerate(zip(scopes, classes + [""] * len(scopes))):
            if depth == 0:
                continue
            i = layer_of_path.get(p)
            if i is None:
                i = layer_of_path[p] = len(recs)
                recs.append({"path": p, "type": cls.rsplit(".", 1)[-1] or "Module", "parent": parent,
                             "children": [], "depth": depth})
                recs[parent]["children"].append(i)
            parent = i
        return parent

    node_layer: list[int] = []
    for k, node in enumerate(g.node):
        if use_scopes:
            s = scoped[k]
            node_layer.append(layer_for(*s) if s else 0)
        else:
            name = node.name or f"{node.op_type}_{k}"
            i = len(recs)
            recs.append({"path": name, "type": node.op_type, "parent": 0, "children": [], "depth": 1})
            recs[0]["children"].append(i)
            node_layer.append(i)
    # ---- nodes and ops
    producer: dict[str, int] = {}
    param_first: dict[str, int] = {}       # initializer -> first node reading it
    param_users: dict[str, set] = {}
    nodes: list[NodeRecord] = []
    ops: list[OpEvent] = []
    unknown: dict[str, None] = {}
    for k, node in enumerate(g.node):
        attrs = node_attributes(node, opset, shapes)
        ins = [shapes.get(n) if n else None for n in node.input]
        outs = [shapes.get(n) for n in node.output]
        op = onnx_key(node.op_type, node.domain)
        cost = _ZERO
        if node.op_type in ("If", "Loop", "Scan"):
            status, macs, flops, extra = _control_flow(node, attrs, shapes, consts, opset, registry)
            attrs = {k: v for k, v in attrs.items() if not hasattr(v, "node")} | extra
        else:
            status, cost = node_costs(node.op_type, ins, outs, attrs, registry, node.domain)
            macs, flops = cost.macs, cost.flops
        for n in list(node.input) + list(node.output):
            if n and _numel(shapes.get(n)) is None:
                unknown[n] = None
        r_bytes = [nbytes(n) for n in node.input if n]
        w_bytes = [nbytes(n) for n in node.output if n]
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
        params = pbytes = 0
        for n in node.input:
            if n and is_param(n):
                param_users.setdefault(n, set()).add(node_layer[k])
                if n not in param_first:
                    param_first[n] = k
                    params += _numel(shapes[n]) or 0
                    pbytes += nbytes(n) or 0
        costs = Costs(macs, flops, read, written)
        scopes = scoped[k]
        module = scopes[0][-1] if scopes else None
        nodes.append(NodeRecord(
            index=k, name=node.name or f"{node.op_type}_{k}", op_type=node.op_type, domain=node.domain,
            module=module,
            inputs=tuple((n, shapes.get(n), dtypes.get(n, ("?", 0))[0]) for n in node.input),
            outputs=tuple((n, shapes.get(n), dtypes.get(n, ("?", 0))[0]) for n in node.output),
            attributes=attrs, params=params, param_bytes=pbytes, costs=costs, status=status))
        prods = []
        for n in node.input:
            if not n:
                continue
            if n in producer:
                prods.append(producer[n])
            elif n in graph_inputs:
                prods.append(PRODUCER_INPUT)
            elif n in inits:
                prods.append(PRODUCER_STATE)
            else:
                prods.append(PRODUCER_UNKNOWN)
        window = None
        if node.op_type in ("Conv", "ConvTranspose", "MaxPool", "AveragePool") and "kernel_shape" in attrs:
            nd = len(attrs["kernel_shape"])
            window = Window("tconv" if node.op_type == "ConvTranspose" else "conv", tuple(attrs["kernel_shape"]),
                            tuple(attrs["strides"]), tuple(attrs["pads"][:nd]), tuple(attrs["dilations"]))
        ops.append(OpEvent(index=k, op=f"onnx.{op}" + (" (unknown shape)" if status == "unknown shape" else ""),
                           layer=node_layer[k], phase=FORWARD,
                           status="uncounted" if status == "unknown shape" else status, costs=costs,
                           producers=tuple(prods), window=window))
        for n in node.output:
            if n:
                producer[n] = k
    # ---- layer records
    n_layers = len(recs)
    params_at: list[list[ParamSpec]] = [[] for _ in range(n_layers)]
    counted_at = [0] * n_layers
    for name, k in param_first.items():
        layer = node_layer[k]
        t = shapes[name]
        spec = ParamSpec(name, t, _numel(t) or 0, nbytes(name) or 0, True, len(param_users[name]) > 1)
        params_at[layer].append(spec)
        counted_at[layer] += spec.numel
    subtree = list(counted_at)
    for i in range(n_layers - 1, 0, -1):
        subtree[recs[i]["parent"]] += subtree[i]
    in_layer: list[set] = [set() for _ in range(n_layers)]
    for k, li in enumerate(node_layer):        # each node counts for its layer and the ancestors
        while li is not None:
            in_layer[li].add(k)
            li = recs[li]["parent"]
    consumers: dict[str, list[int]] = {}
    for k, node in enumerate(g.node):
        for n in node.input:
            if n:
                consumers.setdefault(n, []).append(k)
    graph_outputs = {o.name for o in g.output}

    def spec(name: str) -> TensorSpec:
        s = shapes.get(name)
        return TensorSpec(tuple(d if isinstance(d, int) else -1 for d in s) if s is not None else (),
                          dtypes.get(name, ("?", 0))[0], nbytes(name) or 0)

    layers: list[LayerRecord] = []
    layer_outputs: list[tuple[int, ...]] = []
    for i, r in enumerate(recs):
        mine = in_layer[i]
        ins_, outs_ = {}, {}
        for k in sorted(mine):
            for n in g.node[k].input:
                if n and n not in inits and (producer.get(n) not in mine) and not is_param(n):
                    ins_[n] = None
            for n in g.node[k].output:
                if n and (n in graph_outputs or any(c not in mine for c in consumers.get(n, []))):
                    outs_[n] = None
        if i == 0:
            ins_ = dict.fromkeys(graph_inputs)
            outs_ = dict.fromkeys(o.name for o in g.output)
        kernel = None
        conv_nodes = [k for k in mine if g.node[k].op_type in ("Conv", "ConvTranspose")]
        if len(conv_nodes) == 1 and (not r["children"]):
            kernel = tuple(nodes[conv_nodes[0]].attributes.get("kernel_shape", ())) or None
        layers.append(LayerRecord(
            index=i, path=r["path"], type=r["type"], depth=r["depth"], call_index=0, parent=r["parent"],
            children=tuple(r["children"]), inputs=tuple(spec(n) for n in ins_),
            outputs=tuple(spec(n) for n in outs_), params=tuple(params_at[i]), buffers=(),
            num_params=counted_at[i], trainable_params=counted_at[i], subtree_params=subtree[i],
            kernel_size=kernel))
        layer_outputs.append(tuple(producer.get(n, PRODUCER_INPUT) for n in outs_))
    # layers must be in pre-order (a parent before its children, subtrees contiguous)
    order: list[int] = []

    def visit(i: int) -> None:
        order.append(i)
        for c in recs[i]["children"]:
            visit(c)
    visit(0)
    if order != list(range(n_layers)):
        remap = {old: new for new, old in enumerate(order)}
        layers = [_renumber(layers[old], remap) for old in order]
        layer_outputs = [layer_outputs[old] for old in order]
        ops = [_replace_layer(o, remap[o.layer]) for o in ops]
    total_params = sum(_numel(shapes[n]) or 0 for n in param_first)
    param_bytes = sum(nbytes(n) or 0 for n in param_first)
    shared = sum(_numel(shapes[n]) or 0 for n in param_first if len(param_users[n]) > 1)
    options = {"format": "onnx", "opset": opset}
    merged = _merged_initializers(model, recs, param_users, shapes) if use_scopes else None
    if merged:
        options["merged_initializers"] = merged
    if custom is not None:         # as analyze(costs=...) records it: the numbers follow another registry
        options["costs"] = custom
    trace = Trace(
        model_name=g.name or "onnx", layers=tuple(layers), ops=tuple(ops), layer_outputs=tuple(layer_outputs),
        param_numel=total_params, trainable_numel=total_params, shared_numel=shared, param_bytes=param_bytes,
        buffer_numel=0, buffer_bytes=0, input_bytes=sum(nbytes(n) or 0 for n in graph_inputs),
        output_bytes=sum(nbytes(o.name) or 0 for o in g.output), options=options)
    hist: dict[str, int] = {}
    for n in nodes:
        hist[n.op_type] = hist.get(n.op_type, 0) + 1
    symbolic = sorted({d for s in shapes.values() if s for d in s if isinstance(d, str)})
    info = OnnxGraph(nodes=tuple(nodes), opset=opset, histogram=dict(sorted(hist.items(), key=lambda kv: -kv[1])),
                     peak_activation_bytes=_peak(g, graph_inputs, inits, nbytes, consumers, graph_outputs),
                     unknown_shapes=tuple(unknown), symbolic_dims=tuple(symbolic))
    return trace, info


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


def _renumber(r: LayerRecord, remap: dict[int, int]) -> LayerRecord:
    import dataclasses
    return dataclasses.replace(r, index=remap[r.index], parent=None if r.parent is None else remap[r.parent],
                               children=tuple(remap[c] for c in r.children))


def _replace_layer(o: OpEvent, layer: int) -> OpEvent:
    import dataclasses
    return dataclasses.replace(o, layer=layer)


def _peak(g, graph_inputs, inits, nbytes, consumers, graph_outputs) -> int | None:
    """Largest sum of live activation bytes over the node order: a value lives from the node that
    makes it (graph inputs: from the start) to its last reader (graph outputs: to the end).
    Initializers are weights, not activations."""
    last: dict[str, int] = {}
    for n, users in consumers.items():
        last[n] = max(users)
    live = 0
    for n in graph_inputs:
        b = nbytes(n)
        if b is None:
            return None
        live += b
    peak = live
    for k, node in enumerate(g.node):
        for n in node.output:
            if not n:
                continue
            b = nbytes(n)
            if b is None:
                return None
            live += b
        peak = max(peak, live)
        for n in set(list(node.input) + list(node.output)):
            if n and n not in inits and n not in graph_outputs and last.get(n, k) == k:
                b = nbytes(n)
                live -= b or 0
    return peak
