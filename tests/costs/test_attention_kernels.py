"""The fused kernels under SDPA (flash, memory-efficient, cuDNN: CUDA-only, run here on meta tensors,
whose Meta kernels give the real output shapes) and the FP8 matmuls, each against a hand-derived count.

Conventions (README "Cost conventions", costs/attention.py): MACs = Q.K^T + P.V = scores * (D + Dv);
FLOPs = 2 * MACs + scores * (1 scale + 5 softmax [+ 1 bias]); backward recomputes Q.K^T:
scores * (3D + 2Dv) MACs (2.5x forward at D = Dv), FLOPs 2 * MACs + scores * (1 + 5 + 4 + 1 [+ 1]).
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.costs.registry import CostOptions, OpCall

from ..helpers import Fn

A = torch.ops.aten
META = dict(device="meta", dtype=torch.float16)


def op_costs(fn, *args, name, causal="dense", **kw):
    rep = ls.analyze(Fn(fn), *args, causal=causal, **kw)
    found = [o for o in rep.trace.ops if o.op == name]
    assert found, f"{name} not in {[o.op for o in rep.trace.ops]}"
    return found[0].costs


def flash_fwd(q, k, v, causal=False, **kw):
    return A._flash_attention_forward(q, k, v, None, None, q.shape[1], k.shape[1], 0.0, causal, False, **kw)[0]


# ---- flash attention -----------------------------------------------------------------------------
def test_flash_forward_dense_on_meta():
    q = torch.empty(2, 16, 4, 8, **META)                    # [B, S, H, D]: heads third
    c = op_costs(flash_fwd, q, q, q, name="aten._flash_attention_forward")
    # scores = B*H*Sq*Sk = 2*4*16*16 = 2,048; MACs = 2,048 * (8 + 8) = 32,768
    # FLOPs = 2 * 32,768 + 2,048 * (1 scale + 5 softmax) = 65,536 + 12,288 = 77,824
    assert (c.macs, c.flops) == (32_768, 77_824)
    # the layout is the kernel's own: its logsumexp is [B, H, Sq] = [2, 4, 16]. (torch's FlopCounterMode
    # reads this op's q as [B, H, S, D], i.e. 16 heads of 4 queries, and counts 8,192 MACs: not a
    # reference for the heads-third kernels)
    assert tuple(A._flash_attention_forward(q, q, q, None, None, 16, 16, 0.0, False, False)[1].shape) == (2, 4, 16)


def test_flash_forward_causal_unmasked_aligns_bottom_right():
    q, k = torch.empty(1, 4, 1, 8, **META), torch.empty(1, 10, 1, 8, **META)
    f = lambda a, b: flash_fwd(a, b, b, causal=True)  # noqa: E731
    # dense: 4 * 10 = 40 scores * 16 = 640 MACs
    assert op_costs(f, q, k, name="aten._flash_attention_forward").macs == 640
    # flash-attention 2 aligns the causal diagonal bottom right: row i keeps keys j <= i + 10 - 4,
    # 7 + 8 + 9 + 10 = 34 scores (top-left would keep 1 + 2 + 3 + 4 = 10): 34 * 16 = 544 MACs
    assert op_costs(f, q, k, name="aten._flash_attention_forward", causal="unmasked").macs == 544
    # counted dense, the op carries the share the kernel runs: 34 / 40
    rep = ls.analyze(Fn(f), q, k)
    assert [o for o in rep.trace.ops if o.op == "aten._flash_attention_forward"][0].executed == pytest.approx(34 / 40)


def test_flash_forward_sliding_window_unmasked():
    q = torch.empty(1, 8, 2, 8, **META)
    f = lambda a: flash_fwd(a, a, a, causal=True, window_size_left=2, window_size_right=0)  # noqa: E731
    # row i sees keys [i - 2, i]: 1 + 2 + 3*6 = 21 per head, 2 heads = 42 scores; MACs 42 * 16 = 672
    assert op_costs(f, q, name="aten._flash_attention_forward", causal="unmasked").macs == 672
    # dense (the default): 2 * 64 = 128 scores * 16 = 2,048
    assert op_costs(f, q, name="aten._flash_attention_forward").macs == 2_048


def test_flash_gqa_counts_query_heads_and_alibi_is_a_bias():
    q, k = torch.empty(1, 4, 8, 16, **META), torch.empty(1, 4, 2, 16, **META)   # 8 query, 2 kv heads
    slopes = torch.empty(8, device="meta", dtype=torch.float32)
    f = lambda a, b: flash_fwd(a, b, b, alibi_slopes=slopes)  # noqa: E731
    # scores = 8 heads * 4 * 4 = 128; MACs = 128 * 32 = 4,096; FLOPs 8,192 + 128 * 7 = 9,088
    c = op_costs(f, q, k, name="aten._flash_attention_forward")
    assert (c.macs, c.flops) == (4_096, 9_088)


def test_flash_backward_on_meta():
    q = torch.empty(2, 16, 4, 8, **META)
    lse = torch.empty(2, 4, 16, device="meta")
    rng, unused = torch.empty(2, dtype=torch.int64, device="meta"), torch.empty(0, device="meta")

    def f(a):
        return A._flash_attention_backward(a, a, a, a, a, lse, None, None, 16, 16, 0.0, False, rng, unused)[0]
    c = op_costs(f, q, name="aten._flash_attention_backward")
    # scores 2,048; MACs = 2,048 * (3*8 + 2*8) = 81,920 = 2.5 x the forward's 32,768
    # FLOPs = 163,840 + 2,048 * 11 = 186,368
    assert (c.macs, c.flops) == (81_920, 186_368)
    c = op_costs(lambda a: A._flash_attention_backward(a, a, a, a, a, lse, None, None, 16, 16, 0.0, True,
                                                        rng, unused)[0], q,
                 name="aten._flash_attention_backward", causal="unmasked")
    # causal, square: 16*17/2 = 136 kept per (batch, head), 8 of them: 1,088 scores * 40 = 43,520
    assert c.macs == 43_520


# ---- varlen (packed sequences: nested tensors, padding-free batches) -------------------------------
def _varlen_call(cu, **over):
    """A direct OpCall: the flash kernel has no CPU kernel to run, and readable cu_seqlens need real
    values, which a meta run has not."""
    func = A._flash_attention_forward.default
    q = torch.empty(20, 4, 8, **META)                          # 5 + 15 tokens packed, H=4, D=8
    args = (q, q, q, cu, cu, 15, 15, 0.0, bool(over.get("causal", False)), False)
    return OpCall(func, args, {}, None, CostOptions(over.get("mode", "dense")))


def test_flash_varlen_readable_lengths_are_summed_per_sequence():
    from layerscope.costs.attention import flash_forward
    cu = torch.tensor([0, 5, 20], dtype=torch.int32)
    # sequences of 5 and 15: 25 + 225 = 250 scores per head, 4 heads = 1,000; MACs 1,000 * 16 = 16,000
    # (a dense [2, 15, 15] batch would count 2 * 225 * 4 = 1,800 scores)
    c = flash_forward(_varlen_call(cu))
    assert (c.macs, c.flops) == (16_000, 32_000 + 6_000)
    # causal unmasked: 5*6/2 + 15*16/2 = 15 + 120 = 135 per head, 540 scores: 8,640 MACs
    assert flash_forward(_varlen_call(cu, causal=True, mode="unmasked")).macs == 8_640


def test_attention_shape_for_the_step_time_model():
    """Each fused kernel hands the step-time model its query rows (batch and heads included) and head
    dims (OpEvent.attention), which its speed depends on beyond its FLOPs."""
    from layerscope.costs.attention import flash_forward
    from layerscope.trace import AttentionShape
    # heads-third flash on [B 2, S 16, H 4, D 8]: 2 * 16 * 4 = 128 query rows
    q = torch.empty(2, 16, 4, 8, **META)
    rep = ls.analyze(Fn(flash_fwd), q, q, q)
    op = [o for o in rep.trace.ops if o.op == "aten._flash_attention_forward"][0]
    assert op.attention == AttentionShape(rows=128, head_dim=8, value_dim=8, backward=False)
    # packed sequences of 5 and 15 tokens, 4 heads: 20 * 4 = 80 rows
    c = flash_forward(_varlen_call(torch.tensor([0, 5, 20], dtype=torch.int32)))
    assert c.attention == AttentionShape(80, 8, 8, False)
    # SDPA on [B 2, H 3, S 5, D 8] (CPU's flash kernel), causal: 2 * 3 * 5 = 30 rows, masked; its backward,
    # V of 6
    q = torch.randn(2, 3, 5, 8)
    rep = ls.analyze(Fn(lambda a: torch.nn.functional.scaled_dot_product_attention(a, a, a, is_causal=True)), q)
    assert [o.attention for o in rep.trace.ops if "attention" in o.op] == [AttentionShape(30, 8, 8, False, True)]
    from layerscope.costs.attention import _sdpa
    c = _sdpa(q, q, torch.empty(2, 3, 5, 6), True, False, True, CostOptions())
    assert c.attention == AttentionShape(30, 8, 6, True, masked=True)
    # counted "unmasked", the causal kernel is still masked (its rows cost as a masked kernel's); with
    # dropout_p it draws a random number per score
    c = _sdpa(q, q, q, True, False, False, CostOptions("unmasked"), dropout=True)
    assert c.attention == AttentionShape(30, 8, 8, False, masked=True, dropout=True) and c.executed == 1.0


def test_flash_varlen_on_meta_is_uncounted_not_guessed():
    q = torch.empty(20, 4, 8, **META)
    cu = torch.tensor([0, 5, 20], dtype=torch.int32).to("meta")   # no values: lengths unknowable
    f = lambda a: A._flash_attention_forward(a, a, a, cu, cu, 15, 15, 0.0, False, False)[0]  # noqa: E731
    rep = ls.analyze(Fn(f), q)
    assert rep.totals.macs == 0
    assert [u.op for u in rep.coverage.uncounted] == ["aten._flash_attention_forward"]
    assert not rep.coverage.complete


# ---- memory-efficient attention ------------------------------------------------------------------
def eff_fwd(q, k, v, bias=None, mask_type=0, **kw):
    return A._efficient_attention_forward(q, k, v, bias, None, None, None, None, 0.0, mask_type, True, **kw)[0]


def test_efficient_forward_bias_and_mask_types_on_meta():
    q = torch.empty(2, 16, 4, 8, **META)
    bias = torch.empty(2, 4, 16, 16, **META)
    c = op_costs(lambda a, b: eff_fwd(a, a, a, b), q, bias, name="aten._efficient_attention_forward")
    # 2,048 scores, 32,768 MACs; FLOPs 65,536 + 2,048 * (1 + 5 + 1 bias add) = 79,872
    assert (c.macs, c.flops) == (32_768, 79_872)
    qr, kr = torch.empty(1, 4, 1, 8, **META), torch.empty(1, 10, 1, 8, **META)
    # custom_mask_type 1 = causal from the top left: 1 + 2 + 3 + 4 = 10 scores * 16 = 160 MACs;
    # 2 = from the bottom right: 7 + 8 + 9 + 10 = 34 scores * 16 = 544 MACs; dense 40 * 16 = 640
    for mask_type, unmasked in ((1, 160), (2, 544)):
        f = lambda a, b: eff_fwd(a, b, b, mask_type=mask_type)  # noqa: E731, B023
        assert op_costs(f, qr, kr, name="aten._efficient_attention_forward").macs == 640
        assert op_costs(f, qr, kr, name="aten._efficient_attention_forward", causal="unmasked").macs == unmasked


def test_efficient_backward_on_meta():
    q = torch.empty(2, 16, 4, 8, **META)
    out, lse, seed, off, *_ = A._efficient_attention_forward(q, q, q, None, None, None, None, None, 0.0, 0, True)

    def f(a):
        return A._efficient_attention_backward(a, a, a, a, None, out, None, None, 16, 16, lse, 0.0, seed, off,
                                               0, False)[0]
    c = op_costs(f, q, name="aten._efficient_attention_backward")
    # as flash's backward: 81,920 MACs, 163,840 + 2,048 * 11 = 186,368 FLOPs
    assert (c.macs, c.flops) == (81_920, 186_368)


# ---- the SDPA-level CUDA ops, on meta --------------------------------------------------------------
@pytest.mark.parametrize("name, call", [
    ("_scaled_dot_product_flash_attention", lambda a: A._scaled_dot_product_flash_attention(a, a, a)[0]),
    ("_scaled_dot_product_efficient_attention",
     lambda a: A._scaled_dot_product_efficient_attention(a, a, a, None, False)[0]),
    ("_scaled_dot_product_cudnn_attention",
     lambda a: A._scaled_dot_product_cudnn_attention(a, a, a, None, False)[0]),
])
def test_sdpa_cuda_ops_on_meta(name, call):
    q = torch.empty(2, 4, 16, 8, **META)                    # [B, H, S, D]: heads second at this level
    # the same 2*4*16*16 = 2,048 scores as above: 32,768 MACs, 77,824 FLOPs
    c = op_costs(call, q, name="aten." + name)
    assert (c.macs, c.flops) == (32_768, 77_824)
    # independently: torch's FlopCounterMode counts the two matmuls as 2 x MACs
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as fc:
        call(q)
    assert fc.get_total_flops() == 2 * 32_768


def test_analyze_of_a_module_calling_flash_on_device_meta():
    class FlashBlock(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(32, 96)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, 4, 8).unbind(2)     # [B, S, H=4, D=8] each
            return flash_fwd(q, k, v, causal=True)

    x = torch.randn(2, 16, 32)
    rep = ls.analyze(FlashBlock(), x, device="meta")
    # qkv: 32 rows * 32 * 96 = 98,304; flash: 2,048 scores * 16 = 32,768 -> 131,072 MACs
    assert rep.totals.macs == 131_072 and rep.coverage.complete
    # unmasked: 2 * 4 * 136 = 1,088 scores * 16 = 17,408 -> 115,712
    assert ls.analyze(FlashBlock(), x, device="meta", causal="unmasked").totals.macs == 115_712


# ---- FP8 matmuls ----------------------------------------------------------------------------------
def test_scaled_mm_fp8_on_cpu():
    torch.manual_seed(0)
    a = torch.randn(48, 80).to(torch.float8_e4m3fn)
    b = torch.randn(112, 80).to(torch.float8_e4m3fn).t()      # column-major, as the kernel wants
    one = torch.tensor(1.0)
    f = lambda x, y: torch._scaled_mm(x, y, one, one, out_dtype=torch.float32)  # noqa: E731
    c = op_costs(f, a, b, name="aten._scaled_mm")
    # 48 * 80 * 112 = 430,080 MACs, 860,160 FLOPs (the scales are not counted, as matmul's alpha)
    assert (c.macs, c.flops) == (430_080, 860_160)
    from torch.utils.flop_counter import FlopCounterMode     # independently: torch's own counter
    with FlopCounterMode(display=False) as fc:
        f(a, b)
    assert fc.get_total_flops() == 2 * 430_080
    bias = torch.randn(112, dtype=torch.bfloat16)
    g = lambda x, y: torch._scaled_mm(x, y, one, one, bias=bias, out_dtype=torch.bfloat16)  # noqa: E731
    # + 48 * 112 = 5,376 bias adds
    assert op_costs(g, a, b, name="aten._scaled_mm").flops == 865_536
    # and the same on meta
    assert op_costs(f, a.to("meta"), b.to("meta"), name="aten._scaled_mm").macs == 430_080


def test_scaled_grouped_mm_on_meta():
    a = torch.empty(3, 16, 32, device="meta", dtype=torch.float8_e4m3fn)
    b = torch.empty(3, 48, 32, device="meta", dtype=torch.float8_e4m3fn).transpose(-2, -1)
    sa, sb = torch.empty(3, 16, device="meta"), torch.empty(3, 48, device="meta")
    f = lambda x, y: A._scaled_grouped_mm(x, y, sa, sb, out_dtype=torch.bfloat16)  # noqa: E731
    # 3 groups of [16, 32] @ [32, 48]: 3 * 16 * 32 * 48 = 73,728 MACs
    assert op_costs(f, a, b, name="aten._scaled_grouped_mm").macs == 73_728


def test_weight_only_quantized_and_foreach_mm_on_cpu():
    torch.manual_seed(0)
    x = torch.randn(6, 64)
    w8, scales = torch.randint(-128, 127, (24, 64), dtype=torch.int8), torch.ones(24)
    # x [6, 64] @ W^T, W [24, 64] int8: 6 * 64 * 24 = 9,216 MACs
    assert op_costs(lambda a: A._weight_int8pack_mm(a, w8, scales), x, name="aten._weight_int8pack_mm").macs \
        == 9_216
    packed = A._convert_weight_to_int4pack_for_cpu(torch.randint(0, 16, (32, 64), dtype=torch.int32), 1)
    sz = torch.ones(2, 32, 2, dtype=torch.bfloat16)        # group size 32 over k = 64: 2 groups
    f = lambda a: A._weight_int4pack_mm_for_cpu(a, packed, 32, sz)  # noqa: E731
    # the packed weight [32, 32] uint8 holds a [32, 64] int4 matrix: 6 * 64 * 32 = 12,288 MACs
    assert op_costs(f, x.bfloat16(), name="aten._weight_int4pack_mm_for_cpu").macs == 12_288
    g = lambda a, b: A._foreach_mm([a, b], [torch.randn(3, 7), torch.randn(5, 1)])[0]  # noqa: E731
    # [2, 3] @ [3, 7] = 42 and [4, 5] @ [5, 1] = 20: 62 MACs
    assert op_costs(g, torch.randn(2, 3), torch.randn(4, 5), name="aten._foreach_mm").macs == 62


# ---- nested (jagged) tensors on CPU: SDPA's math path runs matmul per sequence --------------------
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")  # torch-internal
def test_nested_sdpa_on_cpu_counts_each_sequence():
    import torch.nn.functional as F
    from layerscope.costs.attention import flash_forward
    torch.manual_seed(0)
    seqs = [torch.randn(5, 4, 8), torch.randn(15, 4, 8)]              # lengths 5 and 15, H=4, D=8
    nt = torch.nested.nested_tensor(seqs, layout=torch.jagged).transpose(1, 2)   # [B, H, j, D]
    rep = ls.analyze(Fn(lambda a: F.scaled_dot_product_attention(a, a, a)), nt)
    # Q.K^T: 4 heads * (5*5 + 15*15) * 8 = 8,000; P.V the same: 16,000 MACs (a padded [2, 4, 15, 8]
    # batch would count 2 * 4 * 225 * 16 = 28,800)
    assert rep.totals.macs == 16_000 and rep.coverage.complete, rep.coverage
    # and the same as the CUDA flash kernel's varlen formula on these lengths (cu_seqlens [0, 5, 20])
    assert flash_forward(_varlen_call(torch.tensor([0, 5, 20], dtype=torch.int32))).macs == 16_000


def test_matmul_arriving_whole():
    """aten.matmul reaches the recorder whole when nothing decomposes it (inference mode): one dot
    product of length k per output element, broadcasting and 1-D operands included."""
    from layerscope.costs.matmul import matmul
    cases = [((2, 3, 4), (4, 5), 2 * 3 * 5 * 4),      # broadcast rhs: 120
             ((4,), (4, 6), 6 * 4),                    # 1-D lhs: 24
             ((3, 4), (4,), 3 * 4),                    # 1-D rhs: 12
             ((7,), (7,), 7)]                          # dot: 7
    for sa, sb, macs in cases:
        a, b = torch.randn(sa), torch.randn(sb)
        call = OpCall(A.matmul.default, (a, b), {}, torch.matmul(a, b), CostOptions())
        assert (matmul(call).macs, matmul(call).flops) == (macs, 2 * macs)


def test_varlen_backward_and_efficient_varlen_direct():
    from layerscope.costs.attention import efficient_forward, flash_backward
    cu = torch.tensor([0, 5, 20], dtype=torch.int32)
    q = torch.empty(20, 4, 8, **META)
    lse, rng, unused = torch.empty(4, 20, device="meta"), torch.empty(2, device="meta"), torch.empty(0, device="meta")
    args = (q, q, q, q, q, lse, cu, cu, 15, 15, 0.0, False, rng, unused)
    c = flash_backward(OpCall(A._flash_attention_backward.default, args, {}, None, CostOptions()))
    # 1,000 scores (5*5 + 15*15 per head, 4 heads) * (3*8 + 2*8) = 40,000 MACs; 80,000 + 11,000 FLOPs
    assert (c.macs, c.flops) == (40_000, 91_000)
    # efficient attention packs as [1, T, H, D]; custom_mask_type 2 (bottom right) on equal lengths is
    # the plain causal triangle: 15 + 120 = 135 per head, 540 scores * 16 = 8,640 MACs when unmasked
    q1 = q[None]
    args = (q1, q1, q1, None, cu, cu, 15, 15, 0.0, 2, False)
    for mode, macs in (("dense", 16_000), ("unmasked", 8_640)):
        c = efficient_forward(OpCall(A._efficient_attention_forward.default, args, {}, None, CostOptions(mode)))
        assert c.macs == macs
