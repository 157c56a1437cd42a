"""Every formula against a hand-derived number (derivation in the comment beside it)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import layerscope as ls
from layerscope.costs import register
from layerscope.costs.registry import op_exists, registered_names
from layerscope.errors import RegistryError

from ..helpers import Fn


def costs(fn, *args, backward=False, **kw):
    rep = ls.analyze(Fn(fn), *args, backward=backward, **kw)
    return rep


def op(rep, name, phase="forward"):
    found = [o for o in rep.trace.ops if o.op == name and o.phase == phase]
    assert found, f"{name} not in {[o.op for o in rep.trace.ops]}"
    return found[0].costs


def test_registry_names_exist_in_torch():
    missing = [n for n in registered_names() if not op_exists(n)]
    assert not missing, f"registered names unknown to this torch (typos?): {missing}"


def test_duplicate_registration_raises():
    with pytest.raises(RegistryError):
        register("addmm")(lambda c: None)


# ---- matmul family -------------------------------------------------------------------------------
def test_mm_addmm_bias():
    a, b, bias = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)
    # mm: 3*4*5 = 60 MACs, 120 FLOPs; bytes read (12 + 20) * 4 = 128, written 15 * 4 = 60
    c = op(costs(torch.mm, a, b), "aten.mm")
    assert (c.macs, c.flops, c.bytes_read, c.bytes_written) == (60, 120, 128, 60)
    # addmm: 60 MACs, 2*60 + 3*5 bias adds = 135 FLOPs
    c = op(costs(lambda x, y, z: torch.addmm(z, x, y), a, b, bias), "aten.addmm")
    assert (c.macs, c.flops) == (60, 135)


def test_bmm_baddbmm_matmul_einsum():
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    # bmm: 2*3*4*5 = 120 MACs
    assert op(costs(torch.bmm, a, b), "aten.bmm").macs == 120
    # baddbmm: 120 MACs, 240 + 2*3*5 = 270 FLOPs
    c = op(costs(lambda x, y: torch.baddbmm(torch.zeros(2, 3, 5), x, y), a, b), "aten.baddbmm")
    assert (c.macs, c.flops) == (120, 270)
    # matmul and einsum decompose to bmm: same 120 MACs
    assert costs(torch.matmul, a, b).totals.macs == 120
    assert costs(lambda x, y: torch.einsum("bij,bjk->bik", x, y), a, b).totals.macs == 120
    # @ on a 1-D rhs: [4, 8] @ [8] = 32 MACs (mv)
    assert costs(lambda x, y: x @ y, torch.randn(4, 8), torch.randn(8)).totals.macs == 32
    # dot: 7 MACs
    assert costs(torch.dot, torch.randn(7), torch.randn(7)).totals.macs == 7


def test_linear_3d_input():
    lin = nn.Linear(16, 32)
    # [2, 5, 16] -> rows 10 * 16 * 32 = 5,120 MACs; FLOPs 10,240 + bias 10*32 = 10,560
    rep = ls.analyze(lin, torch.randn(2, 5, 16))
    assert (rep.totals.macs, rep.totals.flops) == (5_120, 10_560)


# ---- convolution ---------------------------------------------------------------------------------
@pytest.mark.parametrize("module, shape, macs", [
    # Conv1d 4->6, k3, L=10 -> out [1, 6, 8]: 48 * 4 * 3 = 576
    (nn.Conv1d(4, 6, 3, bias=False), (1, 4, 10), 576),
    # Conv2d 4->8, k3, groups 2, dilation 2, pad 2, 9x9 -> out [1, 8, 9, 9] = 648 elems * 2 * 9 = 11,664
    (nn.Conv2d(4, 8, 3, groups=2, dilation=2, padding=2, bias=False), (1, 4, 9, 9), 11_664),
    # Conv3d 2->4, k(1,3,3), 4x6x6 -> out [1, 4, 4, 4, 4] = 256 * 2 * 9 = 4,608
    (nn.Conv3d(2, 4, (1, 3, 3), bias=False), (1, 2, 4, 6, 6), 4_608),
    # ConvTranspose2d 64->32, k4, s2, p1, 16x16 -> 32x32: numel(in) 16,384 * 32 * 16 = 8,388,608
    (nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1, bias=False), (1, 64, 16, 16), 8_388_608),
    # Depthwise Conv2d 8->8 groups 8, k3 pad1, 5x5: out 200 * 1 * 9 = 1,800
    (nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False), (1, 8, 5, 5), 1_800),
])
def test_convolution(module, shape, macs):
    rep = ls.analyze(module, torch.randn(shape))
    assert rep.totals.macs == macs
    assert rep.totals.flops == 2 * macs


def test_conv_bias_flops():
    # Conv2d 3->4, k1, 2x2 with bias: out 16 elems; MACs 16 * 3 = 48; FLOPs 96 + 16 = 112
    rep = ls.analyze(nn.Conv2d(3, 4, 1), torch.randn(1, 3, 2, 2))
    assert (rep.totals.macs, rep.totals.flops) == (48, 112)


def test_conv_backward_is_twice_forward():
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1))
    rep = ls.analyze(net, torch.randn(2, 3, 8, 8), backward=True)
    second = rep.find("2")[0]
    # grad input + grad weight, each as many MACs as the forward: 2 * (2*8*64 * 8*9 = 73,728)
    assert second.forward.macs == 73_728
    assert second.backward.macs == 2 * 73_728
    first = rep.find("0")[0]
    # the first conv's input needs no grad: only grad weight -> as many MACs as the forward
    assert first.backward.macs == first.forward.macs == 2 * 8 * 64 * 27


# ---- attention -----------------------------------------------------------------------------------
def test_sdpa_dense_and_unmasked():
    from tests.zoo.models import SDPABlock
    x = torch.randn(2, 8, 32)
    assert ls.analyze(SDPABlock(), x).totals.macs == SDPABlock.MACS
    assert ls.analyze(SDPABlock(), x, causal="unmasked").totals.macs == SDPABlock.MACS_UNMASKED


def test_sdpa_flops_and_backward():
    q = torch.randn(1, 2, 4, 8, requires_grad=True)
    rep = costs(lambda a: F.scaled_dot_product_attention(a, a, a), q, backward=True)
    fwd = [o for o in rep.trace.ops if o.phase == "forward" and o.costs.macs]
    # B*H = 2, Sq = Sk = 4, D = Dv = 8: scores 32; MACs 32 * 16 = 512; FLOPs 1,024 + 32 * 6 = 1,216
    assert (fwd[0].costs.macs, fwd[0].costs.flops) == (512, 1_216)
    bwd = [o for o in rep.trace.ops if o.phase == "backward" and o.costs.macs]
    # backward: 32 * (3*8 + 2*8) = 1,280 MACs; FLOPs 2,560 + 32 * 11 = 2,912
    assert (bwd[0].costs.macs, bwd[0].costs.flops) == (1_280, 2_912)


def test_sdpa_mask_adds_one_flop_per_score():
    q, mask = torch.randn(1, 2, 4, 8), torch.zeros(4, 4)
    rep = costs(lambda a, m: F.scaled_dot_product_attention(a, a, a, attn_mask=m), q, mask)
    c = [o for o in rep.trace.ops if o.costs.macs][0].costs
    # 32 scores: 2 * 512 + 32 * (1 scale + 5 softmax + 1 mask) = 1,248
    assert (c.macs, c.flops) == (512, 1_248)


def test_causal_unmasked_rectangular():
    # Sq = 3, Sk = 5, top-left causal mask keeps 1 + 2 + 3 = 6 of 15 scores; D = 4:
    # MACs = 6 * (4 + 4) = 48 (dense: 15 * 8 = 120)
    q, k = torch.randn(1, 1, 3, 4), torch.randn(1, 1, 5, 4)
    f = lambda a, b: F.scaled_dot_product_attention(a, b, b, is_causal=True)  # noqa: E731
    assert costs(f, q, k).totals.macs == 120
    assert costs(f, q, k, causal="unmasked").totals.macs == 48
    # counted dense, the op says a tiled kernel runs the kept share, 6 / 15 (the step-time model prices
    # that); counted unmasked, or without a mask, all of it
    op = [o for o in costs(f, q, k).trace.ops if o.costs.macs][0]
    assert op.executed == pytest.approx(6 / 15)
    assert [o for o in costs(f, q, k, causal="unmasked").trace.ops if o.costs.macs][0].executed == 1.0
    assert [o for o in costs(lambda a, b: F.scaled_dot_product_attention(a, b, b), q, k).trace.ops
            if o.costs.macs][0].executed == 1.0


def test_explicit_attention_and_mha():
    from tests.zoo.models import MHA, ExplicitAttention
    q = torch.randn(2, 4, 8, 8)
    assert ls.analyze(ExplicitAttention(), q, q, q).totals.macs == ExplicitAttention.MACS
    x = torch.randn(2, 5, 16)
    fused = ls.analyze(MHA(), x)
    assert any(o.op == "aten._native_multi_head_attention" for o in fused.trace.ops)
    assert fused.totals.macs == MHA.MACS
    assert ls.analyze(MHA(), x, mode="train").totals.macs == MHA.MACS


# ---- embedding, norms, softmax, activations --------------------------------------------------------
def test_embedding_reads_rows_not_table():
    emb = nn.Embedding(1000, 8)
    ids = torch.tensor([[1, 2, 3]])
    c = op(ls.analyze(emb, ids), "aten.embedding")
    # reads 3 int64 ids (24 B) + 3 rows * 8 floats (96 B) = 120 B; writes 96 B; no arithmetic
    assert (c.macs, c.flops, c.bytes_read, c.bytes_written) == (0, 0, 120, 96)


@pytest.mark.parametrize("module, shape, flops", [
    # LayerNorm(8) on [2, 8]: 16 elems * (4 stats + 2 normalise + 2 affine) = 128
    (nn.LayerNorm(8), (2, 8), 128),
    # LayerNorm without affine: 16 * 6 = 96
    (nn.LayerNorm(8, elementwise_affine=False), (2, 8), 96),
    # BatchNorm2d(4) eval on [2, 4, 3, 3]: 72 elems * (2 + 2) = 288
    (nn.BatchNorm2d(4), (2, 4, 3, 3), 288),
    # GroupNorm(2, 4) on [2, 4, 3, 3]: 72 * 8 = 576
    (nn.GroupNorm(2, 4), (2, 4, 3, 3), 576),
    # InstanceNorm2d(4) (no affine) runs batch norm with batch statistics: 72 * (4 + 2) = 432
    (nn.InstanceNorm2d(4), (2, 4, 3, 3), 432),
    # softmax on 12 elems: 5 each = 60
    (nn.Softmax(dim=-1), (3, 4), 60),
    # GELU, ReLU, SiLU: 1 per element
    (nn.GELU(), (3, 4), 12),
    (nn.SiLU(), (3, 4), 12),
])
def test_norm_softmax_activation_flops(module, shape, flops):
    rep = ls.analyze(module, torch.randn(shape))
    assert rep.totals.flops == flops
    assert rep.totals.macs == 0


def test_rms_norm():
    rep = ls.analyze(nn.RMSNorm(8), torch.randn(2, 8))
    if any(o.op == "aten._fused_rms_norm" for o in rep.trace.ops):
        # fused kernel: 16 elems * (square 1 + add 1 + rstd multiply 1 + weight 1) = 64
        assert rep.totals.flops == 64
    else:
        # decomposed on CPU: pow 16 + mean (16 adds + 2 divides) 18 + add eps 2 + rsqrt 2 + mul 16
        # + mul weight 16 = 70
        assert rep.totals.flops == 70


def test_batchnorm_train_flops():
    # BatchNorm2d(4) in training on [2, 4, 3, 3]: 72 * (4 stats + 2 + 2) = 576 (+ the counter add_: 1)
    rep = ls.analyze(nn.BatchNorm2d(4), torch.randn(2, 4, 3, 3), mode="train")
    bn = [o for o in rep.trace.ops if "batch_norm" in o.op][0]
    assert bn.costs.flops == 576


def test_elementwise_broadcast_counts_outputs():
    # [3, 1] + [1, 4] -> 12 outputs -> 12 FLOPs
    assert costs(torch.add, torch.randn(3, 1), torch.randn(1, 4)).totals.flops == 12
    # addcmul: 2 per output element -> 24
    assert costs(lambda a: torch.addcmul(a, a, a), torch.randn(3, 4)).totals.flops == 24


# ---- pooling, resize, reductions -----------------------------------------------------------------
@pytest.mark.parametrize("module, shape, flops", [
    # MaxPool2d(2) [1, 2, 4, 4] -> 8 outputs * 3 comparisons = 24
    (nn.MaxPool2d(2), (1, 2, 4, 4), 24),
    # AvgPool2d(2) -> 8 outputs * 4 = 32
    (nn.AvgPool2d(2), (1, 2, 4, 4), 32),
    # AdaptiveAvgPool2d(2) on 4x4: kernel 2x2, 8 outputs * 4 = 32
    (nn.AdaptiveAvgPool2d(2), (1, 2, 4, 4), 32),
    # AdaptiveMaxPool2d(2): 8 * 3 = 24
    (nn.AdaptiveMaxPool2d(2), (1, 2, 4, 4), 24),
    # MaxPool1d(3) on [1, 2, 9] -> 6 outputs * 2 = 12
    (nn.MaxPool1d(3), (1, 2, 9), 12),
    # Upsample bilinear x2: [1, 1, 2, 2] -> 16 outputs * 7 = 112
    (nn.Upsample(scale_factor=2, mode="bilinear"), (1, 1, 2, 2), 112),
    # nearest: a copy, 0 FLOPs
    (nn.Upsample(scale_factor=2, mode="nearest"), (1, 1, 2, 2), 0),
])
def test_pool_resize(module, shape, flops):
    rep = ls.analyze(module, torch.randn(shape))
    assert rep.totals.flops == flops
    assert rep.coverage.complete


def test_reductions():
    x = torch.randn(3, 4)
    # sum: 12; mean over dim 1: 12 + 3 divides = 15; var: 3 * 12 = 36
    assert costs(torch.sum, x).totals.flops == 12
    assert costs(lambda a: a.mean(dim=1), x).totals.flops == 15
    assert costs(lambda a: a.var(dim=1), x).totals.flops == 36


# ---- recurrent -------------------------------------------------------------------------------------
@pytest.mark.parametrize("steps", [5, 10])
def test_lstm_scales_with_sequence(steps):
    from tests.zoo.models import LSTMNet
    rep = ls.analyze(LSTMNet(), torch.randn(2, steps, 16))
    assert rep.totals.macs == steps * LSTMNet.MACS_PER_STEP
    assert rep.coverage.complete


def test_gru_and_rnn():
    # GRU(16, 32) on [2, 5, 16]: T*B * (16*96 + 32*96) = 10 * 4,608 = 46,080
    assert ls.analyze(nn.GRU(16, 32, batch_first=True), torch.randn(2, 5, 16)).totals.macs == 46_080
    # RNN(16, 32): 10 * (16*32 + 32*32) = 15,360
    assert ls.analyze(nn.RNN(16, 32, batch_first=True), torch.randn(2, 5, 16)).totals.macs == 15_360


def test_lstm_backward_is_counted():
    from tests.zoo.models import LSTMNet
    rep = ls.analyze(LSTMNet(), torch.randn(2, 5, 16), backward=True)
    # the fused backward computes dX/dH and dW for every weight: 2 * forward MACs
    assert rep.totals.backward.macs == 2 * 5 * LSTMNet.MACS_PER_STEP
    assert rep.coverage.complete


def test_uncounted_op_is_reported_not_zero():
    # a Bessel function has no formula: listed in coverage with its count and layer, totals
    # flagged incomplete
    rep = costs(lambda a: torch.special.bessel_j0(a), torch.randn(8))
    assert not rep.totals.complete
    names = [u.op for u in rep.coverage.uncounted]
    assert any("bessel" in n for n in names)
    u = [u for u in rep.coverage.uncounted if "bessel" in u.op][0]
    assert u.count == 1 and u.layers == ("(root)",)


# ---- backward, losses and the remaining formulas -------------------------------------------------
def _bwd_op(rep, name):
    return op(rep, name, phase="backward")


def test_norm_backward_flops():
    x = torch.randn(2, 8, requires_grad=True)
    # LayerNorm(8) backward with affine: 16 elems * 14 = 224
    rep = ls.analyze(nn.LayerNorm(8), x, backward=True)
    assert _bwd_op(rep, "aten.native_layer_norm_backward").flops == 224
    # BatchNorm1d(8) in eval (stored statistics) backward with affine: 16 * 7 = 112
    rep = ls.analyze(nn.BatchNorm1d(8), x, backward=True)
    assert _bwd_op(rep, "aten.native_batch_norm_backward").flops == 112
    # in training (batch statistics): 16 * 14 = 224
    rep = ls.analyze(nn.BatchNorm1d(8), x, backward=True, mode="train")
    assert _bwd_op(rep, "aten.native_batch_norm_backward").flops == 224


def test_softmax_pool_dropout_backward_flops():
    x = torch.randn(1, 2, 4, 4, requires_grad=True)
    # softmax backward: 32 elems * 4 = 128
    rep = costs(lambda a: torch.softmax(a, -1), x, backward=True)
    assert _bwd_op(rep, "aten._softmax_backward_data").flops == 128
    # max pool 2 backward: one scatter-add per grad_out element: 8
    rep = ls.analyze(nn.MaxPool2d(2), x, backward=True)
    assert _bwd_op(rep, "aten.max_pool2d_with_indices_backward").flops == 8
    # avg pool 2 backward: 8 grad_out elements * 4 window = 32
    rep = ls.analyze(nn.AvgPool2d(2), x, backward=True)
    assert _bwd_op(rep, "aten.avg_pool2d_backward").flops == 32
    # nn.Dropout on CPU decomposes (bernoulli_, div_ 32, mul 32 -> 64 forward; backward mul 32)
    rep = ls.analyze(nn.Dropout(0.5), x, backward=True, mode="train")
    assert rep.totals.forward.flops == 64 and rep.totals.backward.flops == 32
    # the fused kernel (CUDA's path), called directly: 32 * 2 = 64 (mask multiply and scale) each way
    y = x.detach()
    assert op(costs(lambda a: torch.ops.aten.native_dropout(a, 0.5, True)[0], y),
              "aten.native_dropout").flops == 64
    mask = torch.ones(1, 2, 4, 4, dtype=torch.bool)
    assert op(costs(lambda g, m: torch.ops.aten.native_dropout_backward(g, m, 2.0), y, mask),
              "aten.native_dropout_backward").flops == 64
    # relu backward (threshold_backward): 2 per element = 64
    rep = ls.analyze(nn.ReLU(), x, backward=True)
    assert _bwd_op(rep, "aten.threshold_backward").flops == 64


def test_losses():
    pred, target = torch.randn(4, 3), torch.randn(4, 3)
    # mse: 12 elems * 3 = 36
    assert op(costs(F.mse_loss, pred, target), "aten.mse_loss").flops == 36
    # nll: 1 per target: 4
    logp, labels = torch.randn(4, 3).log_softmax(-1), torch.tensor([0, 1, 2, 0])
    assert op(costs(F.nll_loss, logp, labels), "aten.nll_loss_forward").flops == 4
    # binary cross-entropy: 12 * 4 = 48
    probs = torch.rand(4, 3)
    assert op(costs(F.binary_cross_entropy, probs, probs.round()), "aten.binary_cross_entropy").flops == 48


def test_addbmm_sort_gather():
    a, b = torch.randn(2, 3, 4), torch.randn(2, 4, 5)
    # addbmm: 2*3*4*5 = 120 MACs; FLOPs 240 + 3*5 = 255
    c = op(costs(lambda x, y: torch.addbmm(torch.zeros(3, 5), x, y), a, b), "aten.addbmm")
    assert (c.macs, c.flops) == (120, 255)
    # sort along 8 elements, 3 rows: 24 elems * ceil(log2 8) = 72 comparisons
    assert op(costs(lambda x: torch.sort(x).values, torch.randn(3, 8)), "aten.sort").flops == 72
    # index_select of 2 rows of a [10, 4] table: reads 2 int64 (16 B) + 8 floats (32 B); writes 32 B
    src, idx = torch.randn(10, 4), torch.tensor([1, 5])
    c = op(costs(torch.index_select, src, 0, idx), "aten.index_select")
    assert (c.flops, c.bytes_read, c.bytes_written) == (0, 48, 32)


def test_lstm_cell_flops():
    # LSTM(4, 8) on [T=3, B=2, 4]: MACs = 6 * (4*32 + 8*32) = 2,304;
    # FLOPs = 2 * 2,304 + 6 steps*rows * 21 per hidden unit * 8 units = 4,608 + 1,008 = 5,616
    rep = ls.analyze(nn.LSTM(4, 8), torch.randn(3, 2, 4))
    c = op(rep, "aten.mkldnn_rnn_layer")
    assert (c.macs, c.flops) == (2_304, 5_616)


def test_fft_bucketize_grid_sample_polar_all_true():
    def flops(fn, *x):
        rep = costs(fn, *x)
        assert rep.coverage.complete
        return rep.totals.flops

    z = torch.randn(4, 8, dtype=torch.complex64)
    # 4 complex transforms of N = 8 points: 5 * 8 * log2(8) = 120 each -> 480; no MACs
    assert flops(torch.fft.fft, z) == 480
    # norm="ortho" scales every output element: + 4 * 8
    assert flops(lambda t: torch.fft.fft(t, norm="ortho"), z) == 512
    # a real transform is half: 2.5 * 8 * 3 * 4 = 240
    assert flops(torch.fft.rfft, torch.randn(4, 8)) == 240
    # irfft to n = 8 real points: 240, and the inverse's 1/n scaling of its 32 outputs
    assert flops(lambda t: torch.fft.irfft(t, n=8), torch.randn(4, 5, dtype=torch.complex64)) == 272
    # 10 values into 7 boundaries: a binary search of ceil(log2(8)) = 3 comparisons each
    assert flops(torch.bucketize, torch.randn(10), torch.sort(torch.randn(7)).values) == 30
    # bilinear grid sampling: 7 per output element, output 1 x 3 x 4 x 5 = 60 -> 420
    g = torch.rand(1, 4, 5, 2) * 2 - 1
    assert flops(lambda x, grid: nn.functional.grid_sample(x, grid, align_corners=False),
                 torch.randn(1, 3, 8, 8), g) == 420
    # polar: cos, sin and two products per element: 4 * 6
    assert flops(torch.polar, torch.rand(6), torch.rand(6)) == 24
    assert flops(torch._is_all_true, torch.ones(5, dtype=torch.bool)) == 5
