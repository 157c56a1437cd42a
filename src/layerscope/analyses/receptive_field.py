"""Receptive field of every layer's output, walking the recorded dataflow of the forward ops.

For a window op with kernel k, stride s, padding p, dilation d on an input with receptive field size
r, effective stride j and effective padding P (per spatial dim):
    k_eff = d*(k-1) + 1;   r' = r + (k_eff - 1)*j;   j' = j*s;   P' = P + p*j
Transposed convolution divides the stride: j' = j/s and r' = r + (k_eff - 1)*j'. Resizing by a factor f
gives j' = j/f. A global reduction over the spatial dims is a window as large as those dims.
Ops without a window pass the field through; where several inputs meet (a residual add, a concat),
the largest field over the paths wins. Model inputs start at r = 1, j = 1, P = 0. Ops that mix every
position without a window (matmul, attention) do not widen the field: it is the spatial field of
convolution/pooling networks, as torchscan defines it (and on branch-free networks equals it).
"""

from __future__ import annotations

from ..trace import BACKWARD, PRODUCER_INPUT, ReceptiveField, Trace, Window

__all__ = ["receptive_fields"]

_BASE = ReceptiveField((1.0,), (1.0,), (0.0,))


def _expand(v: tuple, n: int) -> tuple:
    return v if len(v) == n else (v * n if len(v) == 1 else v[:n] + (v[-1],) * (n - len(v)))


def _apply(rf: ReceptiveField, w: Window) -> ReceptiveField:
    n = len(w.kernel)
    r, j, p = _expand(rf.size, n), _expand(rf.stride, n), _expand(rf.padding, n)
    rs, js, ps = [], [], []
    for i in range(n):
        k_eff = w.dilation[i] * (w.kernel[i] - 1) + 1
        if w.kind == "tconv":
            jn = j[i] / w.stride[i]
            rs.append(r[i] + (k_eff - 1) * jn)
            js.append(jn)
            ps.append(p[i])
        elif w.kind == "resize":
            rs.append(r[i])
            js.append(j[i] / w.stride[i])
            ps.append(p[i])
        else:
            rs.append(r[i] + (k_eff - 1) * j[i])
            js.append(j[i] * w.stride[i])
            ps.append(p[i] + w.padding[i] * j[i])
    return ReceptiveField(tuple(rs), tuple(js), tuple(ps))


def _largest(fields: list[ReceptiveField]) -> ReceptiveField | None:
    if not fields:
        return None
    if len(fields) == 1:
        return fields[0]
    return max(fields, key=lambda f: (max(f.size), max(f.stride)))


def receptive_fields(trace: Trace) -> list[ReceptiveField | None]:
    """Per layer index, the receptive field of its output, or None where no field is defined."""
    if not any(op.window is not None and op.window.kind != "global" and op.phase != BACKWARD
               for op in trace.ops):
        # no convolution/pooling anywhere: a receptive field means nothing here (decided before
        # walking the dataflow, which would come to the same answer)
        return [None] * len(trace.layers)
    op_rf: dict[int, ReceptiveField | None] = {}
    any_window = False
    for op in trace.ops:
        if op.phase == BACKWARD:
            continue
        ins = [_BASE if p == PRODUCER_INPUT else op_rf.get(p) for p in op.producers]
        if op.window is not None:
            src = ins[0] if ins else None
            op_rf[op.index] = _apply(src, op.window) if src is not None else None
            any_window = any_window or op.window.kind != "global"
        else:
            op_rf[op.index] = _largest([f for f in ins if f is not None])
    if not any_window:  # no convolution/pooling anywhere: a receptive field means nothing here
        return [None] * len(trace.layers)
    out = []
    for producers in trace.layer_outputs:
        fields = [_BASE if p == PRODUCER_INPUT else op_rf.get(p) for p in producers]
        out.append(_largest([f for f in fields if f is not None]))
    return out
