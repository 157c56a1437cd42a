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
    fwd = [Costs()] * n
    bwd = [Costs()] * n
    unc = [0] * n
    for op in trace.ops:
        if op.status == "uncounted":
            unc[op.layer] += 1
        if op.status != "counted":
            continue
        if op.phase == BACKWARD:
            bwd[op.layer] = bwd[op.layer] + op.costs
        elif op.phase == FORWARD:  # a training step's loss and optimizer ops are not the model's
            fwd[op.layer] = fwd[op.layer] + op.costs
    fwd_t, bwd_t, unc_t = list(fwd), list(bwd), list(unc)
    # calls are recorded in pre-order, so a child's index is larger than its parent's
    for layer in reversed(trace.layers):
        p = layer.parent
        if p is not None:
            fwd_t[p] = fwd_t[p] + fwd_t[layer.index]
            bwd_t[p] = bwd_t[p] + bwd_t[layer.index]
            unc_t[p] += unc_t[layer.index]
    return fwd, bwd, fwd_t, bwd_t, unc_t


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
