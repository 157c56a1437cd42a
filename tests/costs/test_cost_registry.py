"""A per-analysis cost registry (issue 20, item 2): ``default_registry().copy()`` changed with
``register``/``override`` and passed as ``analyze(..., costs=reg)``. Every expected number is derived
by hand in the comment beside it."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.costs import CostRegistry, OpCall, OpCost, default_registry, registered_names
from layerscope.errors import InputError, RegistryError


# A custom op no built-in formula covers: out = x * alpha + y.
@torch.library.custom_op("lstest_registry::scale_add", mutates_args=())
def scale_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
    return x * alpha + y


@scale_add.register_fake
def _(x, y, alpha):
    return torch.empty_like(x)


class ScaleAdd(nn.Module):
    def forward(self, x):
        return torch.ops.lstest_registry.scale_add(x, x, 2.0)


def scale_add_cost(c: OpCall) -> OpCost:
    # one multiply and one add per output element, no contraction
    return OpCost(0, 2 * c.out.numel())


def fma_as_one(fn):
    """A formula that counts a fused multiply-add as 1 FLOP: the default's FLOPs less one per MAC."""
    def cost(c: OpCall) -> OpCost:
        k = fn(c)
        return k._replace(flops=k.flops - k.macs)
    return cost


def fma_registry() -> CostRegistry:
    reg = default_registry().copy()
    for name in ("mm", "addmm", "bmm", "baddbmm"):
        reg.override(name, fma_as_one(reg.get(name)))
    return reg


def linear_model():
    torch.manual_seed(0)
    return nn.Linear(8, 4)


def test_custom_op_uncounted_by_default_counted_with_override():
    x = torch.randn(2, 8)
    rep = ls.analyze(ScaleAdd(), x)
    # default registry: no formula for the custom op -> uncounted in coverage, never a silent 0
    assert [(u.op, u.count) for u in rep.coverage.uncounted] == [("lstest_registry.scale_add", 1)]
    assert not rep.totals.complete
    reg = default_registry().copy()
    reg.register(torch.ops.lstest_registry.scale_add.default, scale_add_cost)
    rep = ls.analyze(ScaleAdd(), x, costs=reg)
    # (2, 8) output = 16 elements x (1 mul + 1 add) = 32 FLOPs, 0 MACs
    assert rep.totals.flops == 32 and rep.totals.macs == 0
    assert rep.totals.complete and not rep.coverage.uncounted
    # bytes keep the default rule: x and y read (2 x 16 x 4 B = 128), the output written (64 B)
    op = [o for o in rep.trace.ops if o.op == "lstest_registry.scale_add"][0]
    assert (op.costs.bytes_read, op.costs.bytes_written) == (128, 64)
    assert rep.trace.options["costs"] == "custom"


def test_fma_as_one_flop():
    x = torch.randn(2, 8)
    # Linear(8, 4) on (2, 8) is one addmm: 2 x 8 x 4 = 64 MACs; default FLOPs = 2 x 64 + 2 x 4 bias
    # adds (costs/matmul.py addmm: 2*macs + m*n) = 136
    rep = ls.analyze(linear_model(), x)
    assert (rep.totals.macs, rep.totals.flops) == (64, 136)
    # FMA as 1 FLOP: 64 + 8 = 72; MACs unchanged
    rep = ls.analyze(linear_model(), x, costs=fma_registry())
    assert (rep.totals.macs, rep.totals.flops) == (64, 72)
    assert rep.totals.complete


def test_override_does_not_leak():
    before = registered_names()
    before_addmm = default_registry().get("addmm")
    x = torch.randn(2, 8)
    reg = fma_registry()
    reg.remove("t")  # a view: now uncounted in this registry only
    rep = ls.analyze(linear_model(), x, costs=reg)
    assert (rep.totals.macs, rep.totals.flops) == (64, 72)
    assert [u.op for u in rep.coverage.uncounted] == ["aten.t"]
    # a later default analysis gives the default numbers (64 MACs, 136 FLOPs, see above), complete
    rep = ls.analyze(linear_model(), x)
    assert (rep.totals.macs, rep.totals.flops) == (64, 136)
    assert rep.totals.complete and "costs" not in rep.trace.options
    # the default registry is untouched, and read-only
    assert registered_names() == before and default_registry().get("addmm") is before_addmm
    with pytest.raises(RegistryError, match="read-only"):
        default_registry().override("addmm", before_addmm)
    with pytest.raises(RegistryError, match="read-only"):
        default_registry().register(torch.ops.lstest_registry.scale_add, scale_add_cost)


def test_two_threads_two_registries():
    # Both analyses are in flight at once: each thread's addmm formula waits at a barrier for the
    # other's before answering. Thread "fma" must see 72 FLOPs, thread "default-like" 136 (derived above).
    barrier = threading.Barrier(2, timeout=20)

    def waiting(fn):
        def cost(c):
            barrier.wait()
            return fn(c)
        return cost

    base = default_registry().get("addmm")
    regs = {"fma": default_registry().copy(), "plain": default_registry().copy()}
    regs["fma"].override("addmm", waiting(fma_as_one(base)))
    regs["plain"].override("addmm", waiting(base))
    x = torch.randn(2, 8)
    got, errors = {}, []

    def run(key):
        try:
            rep = ls.analyze(linear_model(), x, costs=regs[key])
            got[key] = (rep.totals.macs, rep.totals.flops, rep.totals.complete)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,)) for k in regs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    # a broken barrier would make the formula raise -> the op uncounted (complete False)
    assert got == {"fma": (64, 72, True), "plain": (64, 136, True)}


def test_bad_registry_use():
    reg = default_registry().copy()
    with pytest.raises(RegistryError, match="already has a cost formula"):
        reg.register("addmm", scale_add_cost)
    with pytest.raises(RegistryError, match="no op named aten::addmmm"):
        reg.override("addmmm", scale_add_cost)
    with pytest.raises(RegistryError, match="function of an OpCall"):
        reg.override("addmm", 3)
    with pytest.raises(InputError, match="CostRegistry"):
        ls.analyze(linear_model(), torch.randn(2, 8), costs={"addmm": scale_add_cost})
    # an empty registry prices nothing: every op uncounted, not the default
    rep = ls.analyze(linear_model(), torch.randn(2, 8), costs=CostRegistry())
    assert rep.totals.flops == 0 and {u.op for u in rep.coverage.uncounted} == {"aten.t", "aten.addmm"}


def test_forward_kwargs_still_pass_through():
    class Kw(nn.Module):
        def forward(self, x, *, scale):  # no default: analyze must pass it through
            return x * scale
    # mul of (2, 8): 16 elementwise FLOPs
    rep = ls.analyze(Kw(), torch.ones(2, 8), scale=3.0, costs=default_registry().copy())
    assert rep.totals.flops == 16


def test_formula_returning_no_opcost_is_named():
    # regression: a user formula returning an int was reported as the model's forward failing
    # ("AttributeError: 'int' object has no attribute 'window'"); it now names the formula
    reg = default_registry().copy()
    reg.override("addmm", lambda c: 5)
    model = linear_model()
    w = model.weight.detach().clone()
    with pytest.raises(RegistryError, match=r"cost formula of aten::addmm returned int, not an OpCost"):
        ls.analyze(model, torch.randn(2, 8), costs=reg)
    assert torch.equal(model.weight, w) and not model._forward_hooks and not model._forward_pre_hooks
