"""Per-layer costs from the op events: self (ops that ran directly in a call) and subtree totals.

Every op belongs to exactly one layer record (ops outside any submodule belong to the root call), so
the self costs of all records add up to the model totals exactly, and the subtree total of the root
equals them too.
"""

from __future__ import annotations

from collections import defaultdict

from ..trace import BACKWARD, FORWARD, Costs, Coverage, Trace, UncountedOp

__all__ = ["layer_costs", "coverage"]


def layer_costs(trace: Trace):
    """Per layer index: (forward self, backward self, forward subtree, backward subtree, uncounted ops)."""
    n = len(trace.layers)
    unc = [0] * n
    # running sums as plain [macs, flops, bytes read, bytes written] lists, made into Costs once per
    # layer at the end (a Costs per addition was most of this function's time on a deep model)
    fwd_acc: dict[int, list[int]] = {}
    bwd_acc: dict[int, list[int]] = {}
    for op in trace.ops:
        status = op.status
        if status != "counted":
            if status == "uncounted":
                unc[op.layer] += 1
            continue
        phase = op.phase
        if phase == BACKWARD:
            acc = bwd_acc
        elif phase == FORWARD:  # a training step's loss and optimizer ops are not the model's
            acc = fwd_acc
        else:
            continue
        c = op.costs
        a = acc.get(op.layer)
        if a is None:
            acc[op.layer] = [c.macs, c.flops, c.bytes_read, c.bytes_written]
        else:
            a[0] += c.macs
            a[1] += c.flops
            a[2] += c.bytes_read
            a[3] += c.bytes_written
    fwd_tot = {i: list(a) for i, a in fwd_acc.items()}
    bwd_tot = {i: list(a) for i, a in bwd_acc.items()}
    unc_t = list(unc)
    # calls are recorded in pre-order, so a child's index is larger than its parent's
    for layer in reversed(trace.layers):
        p = layer.parent
        if p is not None:
            i = layer.index
            _add_into(fwd_tot, p, fwd_tot.get(i))
            _add_into(bwd_tot, p, bwd_tot.get(i))
            unc_t[p] += unc_t[i]
    return _as_costs(fwd_acc, n), _as_costs(bwd_acc, n), _as_costs(fwd_tot, n), _as_costs(bwd_tot, n), unc_t


_ZERO = Costs()


def _add_into(acc: dict[int, list[int]], key: int, a: list[int] | None) -> None:
    if a is None:
        return
    b = acc.get(key)
    if b is None:
        acc[key] = list(a)
    else:
        b[0] += a[0]
        b[1] += a[1]
        b[2] += a[2]
        b[3] += a[3]


def _as_costs(acc: dict[int, list[int]], n: int) -> list[Costs]:
    """Per layer, its sums as Costs (layers with none share one zero Costs, a frozen record)."""
    out = [_ZERO] * n
    for i, a in acc.items():
        out[i] = Costs(*a)
    return out


def coverage(trace: Trace) -> Coverage:
    counts: dict[str, int] = defaultdict(int)
    where: dict[str, dict[str, None]] = defaultdict(dict)
    for op in trace.ops:
        if op.status == "uncounted":
            counts[op.op] += 1
            where[op.op][trace.layers[op.layer].name] = None
    uncounted = tuple(UncountedOp(name, counts[name], tuple(where[name]))
                      for name in sorted(counts, key=lambda k: (-counts[k], k)))
    return Coverage(uncounted=uncounted, uncalled_modules=trace.uncalled_modules)
