"""The layer side of an ONNX model's Trace: the layer tree from the exporter's module scopes (or one
layer per node), each layer's record (its parameters, the values crossing its boundary, its kernel),
the pre-order renumbering, and the activations' peak over the node order. formats.onnx prices the
nodes and assembles the Trace from these."""

from __future__ import annotations

import ast
import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from ..trace import PRODUCER_INPUT, LayerRecord, OpEvent, ParamSpec, TensorSpec


def numel(shape) -> int | None:
    if shape is None or any(not isinstance(d, int) for d in shape):
        return None
    return math.prod(shape)


@dataclass(frozen=True, slots=True)
class GraphValues:
    """One inferred graph and its value tables, which every step of onnx_trace reads."""

    g: Any                                  # the GraphProto after shape inference
    shapes: dict                            # value name -> shape (None: unknown)
    dtypes: dict                            # value name -> (dtype name, bytes per element)
    inits: dict                             # initializer name -> TensorProto
    graph_inputs: list                      # the graph's inputs that are not initializers

    def nbytes(self, name: str) -> int | None:
        n = numel(self.shapes.get(name))
        return None if n is None else n * self.dtypes.get(name, ("", 0))[1]

    def is_param(self, name: str) -> bool:
        # floating-point initializers with at least one dim; 0-d ones are the exporter's scalar constants
        t = self.inits.get(name)
        return t is not None and len(t.dims) > 0 and \
            self.dtypes[name][0].startswith(("float", "bfloat", "complex"))


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


@dataclass(frozen=True, slots=True)
class LayerTree:
    """The layers before their records: dicts of path, type, parent, children and depth (the graph's
    root first), each node's module scopes (None where unrecorded) and the layer each node belongs to."""

    scoped: list
    use_scopes: bool
    recs: list[dict]
    node_layer: list[int]


def layer_tree(g) -> LayerTree:
    """Layers from the module scopes when the exporter recorded any (a node belongs to its innermost
    module), else one layer per node under the graph."""
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
    return LayerTree(scoped, use_scopes, recs, node_layer)


def _params_per_layer(v: GraphValues, tree: LayerTree, param_first: dict, param_users: dict):
    """Each layer's parameters (each initializer in the layer of its first reader), their count, and
    the count of its subtree."""
    n_layers = len(tree.recs)
    params_at: list[list[ParamSpec]] = [[] for _ in range(n_layers)]
    counted_at = [0] * n_layers
    for name, k in param_first.items():
        layer = tree.node_layer[k]
        t = v.shapes[name]
        spec = ParamSpec(name, t, numel(t) or 0, v.nbytes(name) or 0, True, len(param_users[name]) > 1)
        params_at[layer].append(spec)
        counted_at[layer] += spec.numel
    subtree = list(counted_at)
    for i in range(n_layers - 1, 0, -1):
        subtree[tree.recs[i]["parent"]] += subtree[i]
    return params_at, counted_at, subtree


def consumers_of(g) -> dict[str, list[int]]:
    """Value name -> the nodes reading it, in node order."""
    consumers: dict[str, list[int]] = {}
    for k, node in enumerate(g.node):
        for n in node.input:
            if n:
                consumers.setdefault(n, []).append(k)
    return consumers


def layer_records(v: GraphValues, tree: LayerTree, nodes: list, producer: dict, param_first: dict,
                  param_users: dict, consumers: dict) -> tuple[list[LayerRecord], list[tuple[int, ...]]]:
    """The LayerRecords in the tree's order and each layer's outputs' producers: a layer's inputs are
    the activations its nodes read from outside it, its outputs those read outside it or by no one but
    the graph's outputs (the root: the graph's own inputs and outputs)."""
    g, recs = v.g, tree.recs
    params_at, counted_at, subtree = _params_per_layer(v, tree, param_first, param_users)
    in_layer: list[set] = [set() for _ in range(len(recs))]
    for k, li in enumerate(tree.node_layer):        # each node counts for its layer and the ancestors
        while li is not None:
            in_layer[li].add(k)
            li = recs[li]["parent"]
    graph_outputs = {o.name for o in g.output}

    def spec(name: str) -> TensorSpec:
        s = v.shapes.get(name)
        return TensorSpec(tuple(d if isinstance(d, int) else -1 for d in s) if s is not None else (),
                          v.dtypes.get(name, ("?", 0))[0], v.nbytes(name) or 0)

    layers: list[LayerRecord] = []
    layer_outputs: list[tuple[int, ...]] = []
    for i, r in enumerate(recs):
        mine = in_layer[i]
        ins_, outs_ = {}, {}
        for k in sorted(mine):
            for n in g.node[k].input:
                if n and n not in v.inits and (producer.get(n) not in mine) and not v.is_param(n):
                    ins_[n] = None
            for n in g.node[k].output:
                if n and (n in graph_outputs or any(c not in mine for c in consumers.get(n, []))):
                    outs_[n] = None
        if i == 0:
            ins_ = dict.fromkeys(v.graph_inputs)
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
    return layers, layer_outputs


def preorder(recs: list[dict], layers: list, layer_outputs: list, ops: list) -> tuple[list, list, list]:
    """Layers, their outputs and the ops renumbered so that layers are in pre-order (a parent before its
    children, subtrees contiguous); unchanged when they already are."""
    order: list[int] = []

    def visit(i: int) -> None:
        order.append(i)
        for c in recs[i]["children"]:
            visit(c)
    visit(0)
    if order != list(range(len(recs))):
        remap = {old: new for new, old in enumerate(order)}
        layers = [_renumber(layers[old], remap) for old in order]
        layer_outputs = [layer_outputs[old] for old in order]
        ops = [_replace_layer(o, remap[o.layer]) for o in ops]
    return layers, layer_outputs, ops


def _renumber(r: LayerRecord, remap: dict[int, int]) -> LayerRecord:
    return dataclasses.replace(r, index=remap[r.index], parent=None if r.parent is None else remap[r.parent],
                               children=tuple(remap[c] for c in r.children))


def _replace_layer(o: OpEvent, layer: int) -> OpEvent:
    return dataclasses.replace(o, layer=layer)


def peak(v: GraphValues, consumers: dict) -> int | None:
    """Largest sum of live activation bytes over the node order: a value lives from the node that
    makes it (graph inputs: from the start) to its last reader (graph outputs: to the end).
    Initializers are weights, not activations."""
    graph_outputs = {o.name for o in v.g.output}
    last: dict[str, int] = {}
    for n, users in consumers.items():
        last[n] = max(users)
    live = 0
    for n in v.graph_inputs:
        b = v.nbytes(n)
        if b is None:
            return None
        live += b
    peak_ = live
    for k, node in enumerate(v.g.node):
        for n in node.output:
            if not n:
                continue
            b = v.nbytes(n)
            if b is None:
                return None
            live += b
        peak_ = max(peak_, live)
        for n in set(list(node.input) + list(node.output)):
            if n and n not in v.inits and n not in graph_outputs and last.get(n, k) == k:
                b = v.nbytes(n)
                live -= b or 0
    return peak_
