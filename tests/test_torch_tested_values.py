"""Values torch's own tests assert, counted by layerscope (issue 58, item 9): each case is the model
or op of a test in the pytorch repository, with the figure that test asserts."""

from __future__ import annotations

import pytest
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


class Varlen(nn.Module):
    """torch.nn.attention.varlen_attn over two packed sequences, causal (window (-1, 0))."""

    def forward(self, q, cu):
        from torch.nn.attention.varlen import varlen_attn
        return varlen_attn(q, q, q, cu, cu, 128, 128, window_size=(-1, 0))


def test_varlen_attention_is_priced_as_torch_counts_it():
    """Before: torch_attn::_varlen_attn (and its backward) were listed as uncounted. torch's
    FlopCounterMode counts seq_lens [128, 64], 8 heads of 64, causal, as 41,943,040 forward FLOPs:
    dense, every score of each sequence, 4 * H * D * sum(S^2) = 4 * 8 * 64 * (128^2 + 64^2). That is
    layerscope's default convention too (causal="dense": the scores the kernel's causal mask drops
    are counted; causal="unmasked" counts the kept ones), so MACs = 41,943,040 / 2."""
    pytest.importorskip("torch.nn.attention.varlen")
    cu = torch.tensor([0, 128, 192], dtype=torch.int32)
    q = torch.randn(192, 8, 64, requires_grad=True)
    rep = ls.analyze(Varlen(), q, cu, device="meta", backward=True)
    assert rep.coverage.complete, rep.coverage
    t = rep.totals
    # scores = 8 * (128^2 + 64^2) = 163,840; forward MACs = scores * (64 + 64) = 20,971,520
    # FLOPs = 2 * MACs + scores * (1 scale + 5 softmax) = 41,943,040 + 983,040
    assert (t.forward.macs, t.forward.flops) == (20_971_520, 42_926_080)
    assert 2 * t.forward.macs == 41_943_040
    # backward: scores * (3 * 64 + 2 * 64) = 52,428,800 MACs: 2.5 x the forward's, as torch counts it
    assert t.backward.macs == 52_428_800
    # causal="unmasked": kept scores 8 * (128 * 129 / 2 + 64 * 65 / 2) = 82,688, * 128 = 10,584,064
    assert ls.analyze(Varlen(), q, cu, device="meta", causal="unmasked").totals.forward.macs == 10_584_064
    # independently: torch's own counter on the op (meta q, the real cu_seq)
    from torch.utils.flop_counter import FlopCounterMode
    qm = torch.empty(192, 8, 64, device="meta")
    with FlopCounterMode(display=False) as fc:
        torch.ops.torch_attn._varlen_attn(qm, qm, qm, cu, cu, 128, 128, True)
    assert fc.get_total_flops() == 41_943_040
