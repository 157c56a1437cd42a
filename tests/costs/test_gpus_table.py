"""The built-in GPU table (costs/gpus.py) and attention's formulas against torch's registered ones."""

import pytest
import torch
from torch.utils import flop_counter

from layerscope.analyses.roofline import PEAKS
from layerscope.costs.attention import attention_cost
from layerscope.costs.gpus import DEFAULT_GPU, GPUS, gpu
from layerscope.errors import InputError


def test_roofline_reads_the_table_with_its_old_figures():
    # roofline's previous literal table (datasheet figures), unchanged by the move.
    assert PEAKS["H100"] == {"bandwidth": 3.35e12, "float32": 67e12, "tf32": 494.7e12, "bfloat16": 989.4e12,
                             "float16": 989.4e12}
    assert PEAKS["V100"] == {"bandwidth": 900e9, "float32": 15.7e12, "float16": 125e12}
    assert set(PEAKS) == set(GPUS)


def test_rows_overrides_and_default():
    h = gpu("h100 pcie")
    assert h.name == "H100-PCIE" and h.capability == (9, 0) and h.memory == 80 * 2**30
    assert gpu().name == DEFAULT_GPU == "H200" and gpu().capability == (9, 0)
    o = gpu("A100", bandwidth=1e12, bfloat16=100e12, memory=2**30)
    assert (o.bandwidth, o.peak("bfloat16"), o.peak("float16"), o.memory) == (1e12, 100e12, 312e12, 2**30)
    assert GPUS["A100"].peak("bfloat16") == 312e12          # the table itself is untouched
    assert gpu("V100").peak("bfloat16") == 15.7e12           # no bf16 row: float32's peak
    with pytest.raises(InputError, match="unknown GPU 'Z9'"):
        gpu("Z9")
    with pytest.raises(InputError, match="bandwidth must be a positive number"):
        gpu("A100", bandwidth=-1)


B, H, S, D = 2, 4, 128, 64


def test_sdpa_formula_agrees_with_torch_registered_flash_and_efficient():
    # Hand derivation, B=2, H=4, S=128, D=64, no mask, not causal:
    #   scores = B*H*S*S = 2*4*128*128 = 131,072
    #   forward: QK^T and P@V, each scores*D MACs -> 2*B*H*S*S*D = 2*131,072*64 = 16,777,216 MACs
    #            (the brief's 8,388,608 is one of the two contractions), 33,554,432 contraction FLOPs.
    #   backward (flash/efficient recompute QK^T): recompute + dV + dP + dQ + dK = 5*scores*D
    #            = 41,943,040 MACs = 2.5x the forward, 83,886,080 FLOPs.
    # torch.utils.flop_counter registers sdpa_flop_count for aten._flash_attention_forward and
    # _efficient_attention_forward (via _flash_attention_forward_flop / _efficient_attention_forward_flop),
    # and sdpa_backward_flop_count (5 bmms: recompute, grad_scores, grad_v, grad_q, grad_k) for the
    # backwards; it counts 2 FLOPs per MAC of the contractions only (softmax free).
    scores = B * H * S * S
    assert scores == 131_072
    fwd = attention_cost(scores, D, D, bias=False)
    bwd = attention_cost(scores, D, D, bias=False, backward=True)
    assert fwd.macs == 16_777_216 and bwd.macs == 41_943_040 and bwd.macs * 2 == fwd.macs * 5
    shape = (B, H, S, D)
    assert flop_counter.sdpa_flop_count(shape, shape, shape) == 2 * fwd.macs == 33_554_432
    assert flop_counter.sdpa_backward_flop_count(shape, shape, shape, shape) == 2 * bwd.macs == 83_886_080
    # The fused kernels' own registered formulas. The kernels take q heads-third, [B, S, H, D] (see
    # costs/attention.py). torch 2.13's dense (not varlen) branches read query.shape as [b, h, s, d]:
    # given the real layout [2, 128, 4, 64] they count b=2, h=128, s=4: 2 * 2*2*128*4*4*64 = 1,048,576
    # FLOPs, not 33,554,432; torch 2.14's flash formulas read the real layout, its efficient ones still
    # do not. So each formula is checked on the layout the running torch reads (exactly one of the two
    # gives the hand-derived figure); layerscope prices the heads-third layout the kernels take.
    dense = (None, None, S, S)  # no cumulative lengths (not varlen), max lengths S
    layouts = [torch.empty(B, S, H, D, device="meta", dtype=torch.bfloat16),
               torch.empty(B, H, S, D, device="meta", dtype=torch.bfloat16)]
    for formula, expected in ((lambda q: flop_counter._flash_attention_forward_flop(q, q, q, *dense), 33_554_432),
                              (lambda q: flop_counter._efficient_attention_forward_flop(q, q, q, None, *dense),
                               33_554_432),
                              (lambda q: flop_counter._flash_attention_backward_flop(q, q, q, q, q, None, *dense),
                               83_886_080),
                              (lambda q: flop_counter._efficient_attention_backward_flop(q, q, q, q, None, q, *dense),
                               83_886_080)):
        assert [formula(q) for q in layouts].count(expected) == 1


def test_sdpa_formula_with_distinct_value_dim_agrees_with_torch():
    # dv != d: forward scores*(d + dv) MACs, backward scores*(3d + 2dv) (torch: recompute, dQ, dK are
    # d-long; dP and dV are dv-long). d=64, dv=32: fwd 131,072*96 = 12,582,912; bwd 131,072*256 = 33,554,432.
    scores = B * H * S * S
    fwd = attention_cost(scores, 64, 32, bias=False)
    bwd = attention_cost(scores, 64, 32, bias=False, backward=True)
    assert (fwd.macs, bwd.macs) == (12_582_912, 33_554_432)
    qs, vs = (B, H, S, 64), (B, H, S, 32)
    assert flop_counter.sdpa_flop_count(qs, qs, vs) == 2 * fwd.macs
    assert flop_counter.sdpa_backward_flop_count(vs, qs, qs, vs) == 2 * bwd.macs
