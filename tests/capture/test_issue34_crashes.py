"""Issue 34, item 2: three crashes found by peers' test suites.

* a backward on meta where autograd handed back a CPU gradient: a meta model (or device="meta") given
  a real input that requires grad ("MmBackward0 returned an invalid gradient ... expected device meta
  but got cpu"); every input now goes to meta with the model (capture/prepare.py);
* an in-place op (``relu_``) on an input that requires grad and comes from the caller's graph: the
  detached leaf made for it refused in-place ops; it is now seen through one identity node, a
  non-leaf as the caller's was (capture/state.py ``non_leaf``);
* lazy parameters (``nn.LazyLinear``'s UninitializedParameter): counted after a first forward
  materialises them, as torchinfo does (capture/prepare.py ``materialize_lazy``).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope as ls
from tests.helpers import assert_sums, assert_unchanged, snapshot


class MM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 10))

    def forward(self, x):
        return torch.mm(x, self.w)


class BMM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(2, 8, 10))

    def forward(self, x):
        return torch.bmm(x, self.w)


class Expand(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 10)

    def forward(self, x):
        return self.lin(x.expand(3, 4, 8))


# (model, input shape, params, forward MACs, backward MACs):
# mm  [4, 8] @ [8, 10]: params 8*10 = 80; forward 4*8*10 = 320; backward grad x [4,10]@[10,8] = 320
#     + grad w [8,4]@[4,10] = 320 -> 640
# bmm [2, 4, 8] @ [2, 8, 10]: params 2*8*10 = 160; forward 2*4*8*10 = 640; backward 2 x 640 = 1,280
# expand [1, 4, 8] -> [3, 4, 8], Linear(8, 10): params 8*10+10 = 90; forward 3*4*8*10 = 960;
#     backward grad input 960 + grad weight 960 = 1,920
CASES = [(MM, (4, 8), 80, 320, 640), (BMM, (2, 4, 8), 160, 640, 1_280), (Expand, (1, 4, 8), 90, 960, 1_920)]


@pytest.mark.parametrize("make,shape,params,fwd,bwd", CASES, ids=["mm", "bmm", "expand"])
@pytest.mark.parametrize("where", ["meta model", "meta model, device=meta", "meta input"])
def test_real_input_that_requires_grad_beside_meta_weights(make, shape, params, fwd, bwd, where):
    torch.manual_seed(0)
    m = make()
    x = torch.randn(*shape, requires_grad=True)
    if where.startswith("meta model"):
        m = m.to("meta")
    else:       # a real model given meta inputs: counted on meta, as device="meta" does
        x = torch.empty(*shape, device="meta", requires_grad=True)
    before = snapshot(m)
    rep = ls.analyze(m, x, backward=True, device="meta" if "device" in where else None)
    assert (rep.totals.params, rep.totals.macs, rep.totals.backward.macs) == (params, fwd, bwd)
    assert_sums(rep)
    assert_unchanged(before, m)
    assert x.grad is None


class InPlace(nn.Module):
    def __init__(self, method: bool) -> None:
        super().__init__()
        self.method = method
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x.relu_() if self.method else torch.relu_(x))


class OutOfPlace(InPlace):
    def forward(self, x):
        return self.lin(torch.relu(x))


@pytest.mark.parametrize("method", [False, True], ids=["torch.relu_", "Tensor.relu_"])
@pytest.mark.parametrize("device", [None, "meta"])
def test_in_place_op_on_a_non_leaf_input(method, device):
    # Linear(8, 8) on [4, 8]: forward 4*8*8 = 256 MACs; backward grad input 256 + grad weight 256 = 512
    torch.manual_seed(0)
    m = InPlace(method)
    a = torch.randn(4, 8, requires_grad=True)
    x = a * 2                      # a non-leaf of the caller's graph
    before, x0 = snapshot(m), x.detach().clone()
    rep = ls.analyze(m, x, backward=True, device=device)
    assert (rep.totals.macs, rep.totals.backward.macs) == (256, 512)
    assert_sums(rep)
    assert_unchanged(before, m)
    # the same counts as the out-of-place twin (a peer value: relu's backward is relu_'s)
    twin = OutOfPlace(method)
    twin.load_state_dict(m.state_dict())
    ref = ls.analyze(twin, x0.clone().requires_grad_(), backward=True, device=device)
    assert rep.totals.forward == ref.totals.forward and rep.totals.backward == ref.totals.backward
    # the caller's graph is not run backward; its tensor is written as a plain call writes it
    assert a.grad is None
    assert torch.equal(x.detach(), x0.relu() if device is None else x0)
    x.sum().backward()
    assert torch.equal(a.grad, torch.full_like(a, 2.0))


def test_lazy_linear_counted_after_materialising():
    # LazyLinear(-> 10) on [4, 8]: in_features 8 from the input; params 8*10 + 10 = 90 (360 bytes);
    # MACs 4*8*10 = 320; FLOPs 2*320 + 4*10 bias adds = 680
    x = torch.randn(4, 8)
    for kw in ({}, {"device": "meta"}):
        rep = ls.analyze(nn.LazyLinear(10), x, **kw)
        assert (rep.totals.params, rep.totals.macs, rep.totals.flops) == (90, 320, 680)
        assert_sums(rep)
    mem = ls.memory(nn.LazyLinear(10), x)
    assert mem.totals["parameter_bytes"] == 360 and mem.totals["gradient_bytes"] == 360
    # the model comes out as its own first call leaves it: the same weights, the same RNG state
    torch.manual_seed(3)
    m = nn.LazyLinear(10)
    ls.analyze(m, x)
    after = torch.get_rng_state()
    torch.manual_seed(3)
    ref = nn.LazyLinear(10)
    ref(x)
    assert type(m) is type(ref) is nn.Linear
    assert torch.equal(m.weight, ref.weight) and torch.equal(m.bias, ref.bias)
    assert torch.equal(after, torch.get_rng_state())


def test_lazy_modules_nested_keep_their_mode_and_statistics():
    # on [4, 8]: LazyLinear(-> 16) 8*16+16 = 144 params, 4*8*16 = 512 MACs; LazyBatchNorm1d(16)
    # 2*16 = 32 params and 16+16+1 = 33 buffer elements; LazyLinear(-> 4) 16*4+4 = 68 params,
    # 4*16*4 = 256 MACs. Params 144+32+68 = 244, MACs 768
    m = nn.Sequential(nn.LazyLinear(16), nn.LazyBatchNorm1d(), nn.ReLU(), nn.LazyLinear(4)).train()
    rep = ls.summary(m, input_size=(4, 8), verbose=0)
    assert (rep.totals.params, rep.totals.buffers, rep.totals.macs) == (244, 33, 768)
    assert m.training and all(c.training for c in m)
    bn = m[1]
    # the materialising call runs in eval mode: no statistics updated (the analysis itself is eval)
    assert int(bn.num_batches_tracked) == 0 and torch.equal(bn.running_mean, torch.zeros(16))
    x = torch.randn(4, 8)
    before = snapshot(m)
    again = ls.analyze(m, x, mode="train", backward=True)
    assert again.totals.params == 244
    assert_unchanged(before, m)


class ParamInForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.p = None

    def forward(self, x):
        if self.p is None:
            self.p = nn.Parameter(torch.ones(8, 10, device=x.device))
        return x @ self.p


def test_parameter_created_in_forward_is_counted():
    # p [8, 10] made by the first forward: params 80; MACs 4*8*10 = 320
    rep = ls.analyze(ParamInForward(), torch.randn(4, 8))
    assert (rep.totals.params, rep.totals.macs) == (80, 320)


def test_lazy_module_never_called_is_one_clear_line():
    class Unused(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.used, self.unused = nn.Linear(8, 4), nn.LazyLinear(3)

        def forward(self, x):
            return self.used(x)

    with pytest.raises(ls.InputError, match="uninitialized"):
        ls.analyze(Unused(), torch.randn(2, 8))
