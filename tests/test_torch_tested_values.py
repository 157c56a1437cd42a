"""Values torch's own tests assert, counted by layerscope (issue 58, item 9): each case is the model
or op of a test in the pytorch repository, with the figure that test asserts."""

from __future__ import annotations

import torch
from torch import nn

import layerscope as ls


class FlopCounterBackward(nn.Module):
    """torch's test/test_flop_counter.py ``test_backward``, as a module: ``a`` [4, 5] (created on the
    CPU with requires_grad), mm by a [5, 6] made in forward, expanded to [7, 4, 6], bmm by a
    [7, 6, 7] made in forward, summed."""

    def forward(self, a):
        a = torch.mm(a, torch.randn(5, 6))
        a = a.unsqueeze(0).expand(7, 4, 6)
        a = torch.bmm(a, torch.randn(7, 6, 7))
        return a.sum()


def test_torch_flop_counter_backward_model_on_meta():
    """Before: a backward on meta raised "BmmBackward0 returned an invalid gradient at index 0 -
    expected device meta but got cpu" (CPU's bmm took the meta activation beside the CPU weight).
    torch asserts 5,184 FLOPs (its FlopCounterMode counts contractions, 2 x MACs):
    forward  mm 4*6*5 = 120 MACs, bmm 7*4*7*6 = 1,176 MACs;
    backward mm's grad of a: 4*5*6 = 120, bmm's grad of its input: 7*4*6*7 = 1,176 (the [7, 6, 7]
    made in forward needs no gradient); 2 * (1,296 + 1,296) = 5,184."""
    a = torch.randn(4, 5, requires_grad=True)
    rep = ls.analyze(FlopCounterBackward(), a, device="meta", backward=True)
    t = rep.totals
    assert (t.forward.macs, t.backward.macs) == (1_296, 1_296)
    assert 2 * (t.forward.macs + t.backward.macs) == 5_184
    # FLOPs: + the sum's 7*4*7 = 196 adds forward; + expand's backward, a sum over 7: 7*4*6 = 168
    assert (t.forward.flops, t.backward.flops) == (2_592 + 196, 2_592 + 168)
    assert a.grad is None                                      # the input is left as it was given
    # the same as the CPU run, and as torch's own counter on it
    cpu = ls.analyze(FlopCounterBackward(), a, backward=True).totals
    assert (cpu.forward.flops, cpu.backward.flops) == (t.forward.flops, t.backward.flops)
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as fc:
        FlopCounterBackward()(a).backward()
    assert fc.get_total_flops() == 5_184
    a.grad = None
