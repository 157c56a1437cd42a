"""Reading an ONNX model: loading it (never its external data), its value shapes after the user's
values replace symbolic dims, and each node's attributes with the schema's defaults filled in (a
conv's kernel from its weight, ``auto_pad`` resolved into pads). formats/onnx.py turns what these
give into the Trace."""

from __future__ import annotations

import math
import os
from typing import Any

from ..errors import InputError

__all__ = ["load_onnx", "infer_shapes", "type_shape", "with_input_shapes", "node_attributes", "value_dtype"]


# ---- loading -----------------------------------------------------------------------------------

def load_onnx(src):
    """The ModelProto of a path, or the ModelProto given. External data is not loaded, and a
    location outside the model's folder is refused."""
    import onnx
    if isinstance(src, onnx.ModelProto):
        return src
    path = os.fspath(src)
    if not os.path.isfile(path):
        raise InputError(f"no ONNX file at {path!r}")
    if os.path.getsize(path) == 0:
        raise InputError(f"{path!r} is empty (0 bytes), not an ONNX model")
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as e:   # onnx raises DecodeError and others
        raise InputError(f"{path!r} is not a readable ONNX model: {e}") from None
    if not model.graph.node and not model.graph.output:
        # protobuf parses many non-ONNX files into an empty message: an empty graph is no model
        raise InputError(f"{path!r} is not an ONNX model: it holds no graph (no nodes, no outputs)")
    folder = os.path.dirname(os.path.realpath(path))
    for t in _all_initializers(model.graph):
        if t.data_location == onnx.TensorProto.EXTERNAL:
            loc = {e.key: e.value for e in t.external_data}.get("location", "")
            full = os.path.realpath(os.path.join(folder, loc))
            if os.path.isabs(loc) or os.path.commonpath([folder, full]) != folder:
                raise InputError(f"initializer {t.name!r} keeps its data at {loc!r}, outside the model's "
                                 f"folder {folder!r}: refused")
    return model


def _all_initializers(graph):
    yield from graph.initializer
    for node in graph.node:
        for a in node.attribute:
            if a.g is not None and a.g.ByteSize():
                yield from _all_initializers(a.g)
            for g in a.graphs:
                yield from _all_initializers(g)


# ---- shapes ------------------------------------------------------------------------------------

def value_dtype(elem_type: int) -> tuple[str, int]:
    import onnx
    try:
        np_dt = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
        return str(np_dt), np_dt.itemsize
    except Exception:
        name = onnx.TensorProto.DataType.Name(elem_type).lower() if elem_type else "unknown"
        return name, {"bfloat16": 2, "float8e4m3fn": 1, "float8e5m2": 1}.get(name, 0)


def type_shape(tp) -> tuple[tuple | None, int]:
    if not tp.HasField("tensor_type"):
        return None, 0
    tt = tp.tensor_type
    if not tt.HasField("shape"):
        return None, tt.elem_type
    dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tt.shape.dim)
    return dims, tt.elem_type


_FLOAT_TYPES = {1, 10, 11, 16}      # float, float16, double, bfloat16


def with_input_shapes(model, input_shapes: dict | None):
    """A copy of the model, without floating-point weight values, whose graph inputs carry the
    user's shapes or symbolic-dim values."""
    import onnx
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for t in m.graph.initializer:      # inference needs weights' dims, not their values (3x faster on ViT-B)
        if t.data_type in _FLOAT_TYPES:
            for f in ("raw_data", "float_data", "double_data", "int32_data"):
                t.ClearField(f)
    if not input_shapes:
        return m
    init = {t.name for t in m.graph.initializer}
    names = [i.name for i in m.graph.input if i.name not in init]
    dims_given = {k: v for k, v in input_shapes.items() if k not in names}
    for k, v in input_shapes.items():
        if k in names and not isinstance(v, (list, tuple)):
            raise InputError(f"input_shapes[{k!r}] must be a shape such as (1, 3, 224, 224), got {v!r}")
    symbols = {d.dim_param for i in m.graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    unknown = [k for k in dims_given if k not in symbols]
    if unknown:
        raise InputError(f"input_shapes names {unknown}: neither graph inputs ({names}) nor symbolic dims "
                         f"({sorted(symbols)})")
    for i in m.graph.input:
        if i.name in init or not i.type.HasField("tensor_type"):
            continue
        shape = input_shapes.get(i.name)
        dims = i.type.tensor_type.shape.dim
        if shape is not None:
            if len(shape) != len(dims) and len(dims):
                raise InputError(f"input {i.name!r} has rank {len(dims)}; input_shapes gave {tuple(shape)}")
            i.type.tensor_type.shape.Clear()
            for s in shape:
                i.type.tensor_type.shape.dim.add().dim_value = int(s)
            continue
        for d in dims:
            if d.dim_param in dims_given:
                d.dim_value = int(dims_given[d.dim_param])
    return m


def infer_shapes(model):
    import onnx
    try:
        return onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False, data_prop=True)
    except Exception:       # inference that fails on one op: keep what the model states
        return model


# ---- attributes --------------------------------------------------------------------------------

def node_attributes(node, opset: int, shapes: dict) -> dict:
    import onnx
    out: dict[str, Any] = {}
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
        for name, a in schema.attributes.items():
            if a.default_value is not None and a.default_value.type:
                out[name] = onnx.helper.get_attribute_value(a.default_value)
    except Exception:     # not a known op (custom domain): its own attributes only
        pass
    for a in node.attribute:
        v = onnx.helper.get_attribute_value(a)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    for k, v in list(out.items()):
        if isinstance(v, bytes):
            out[k] = v.decode()
        elif isinstance(v, list):
            out[k] = [x.decode() if isinstance(x, bytes) else x for x in v]
    if node.op_type in ("Conv", "ConvTranspose", "MaxPool", "AveragePool", "LpPool"):
        _window_attributes(node, out, shapes)
    return out


def _window_attributes(node, out: dict, shapes: dict) -> None:
    """Fill kernel_shape (a conv's from its weight), strides, dilations and explicit pads (auto_pad
    resolved as the spec says)."""
    x = shapes.get(node.input[0]) if node.input else None
    if node.op_type in ("Conv", "ConvTranspose") and len(node.input) > 1:
        w = shapes.get(node.input[1])
        if w is not None and "kernel_shape" not in out:
            out["kernel_shape"] = list(w[2:])
    k = out.get("kernel_shape")
    if k is None:
        return
    nd = len(k)
    out.setdefault("strides", [1] * nd)
    out.setdefault("dilations", [1] * nd)
    if node.op_type in ("Conv", "ConvTranspose"):
        out.setdefault("group", 1)
    auto = out.get("auto_pad", "NOTSET")
    if auto in ("SAME_UPPER", "SAME_LOWER") and x is not None and all(isinstance(d, int) for d in x[2:]):
        pads_b, pads_e = [], []
        for i in range(nd):
            s, d, kk, n = out["strides"][i], out["dilations"][i], k[i], x[2 + i]
            if node.op_type == "ConvTranspose":
                total = max(0, s * (n - 1) + ((kk - 1) * d + 1) - n * s)
            else:
                total = max(0, (math.ceil(n / s) - 1) * s + (kk - 1) * d + 1 - n)
            small, big = total // 2, total - total // 2
            pads_b.append(big if auto == "SAME_LOWER" else small)
            pads_e.append(small if auto == "SAME_LOWER" else big)
        out["pads"] = pads_b + pads_e
    elif auto == "VALID":
        out["pads"] = [0] * (2 * nd)
    out.setdefault("pads", [0] * (2 * nd))
