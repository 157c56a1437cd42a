"""The step-time model (planning/steptime/sharded_time.py): each formula against a hand derivation, and the two-stream
overlap of FSDP's collectives on a hand-made op sequence."""

from types import MappingProxyType, SimpleNamespace

import pytest

from layerscope.costs.gpus import GPU, gpu
from layerscope.errors import InputError
from layerscope.planning.config import ParallelConfig
from layerscope.planning.steptime.sharded_time import (FRACTIONS, assemble, collective_seconds, fractions, host_op_seconds, link_of, op_seconds, rank_seconds)
from layerscope.trace import Costs


def _op(name, status="counted", macs=0, flops=0, read=0, written=0, phase="forward", micro=0, executed=1.0,
        attention=None):
    return SimpleNamespace(op=name, status=status, costs=Costs(macs, flops, read, written), phase=phase,
                           executed=executed, attention=attention)


H100 = gpu("H100")


def test_matmul_roofline_by_hand():
    # [4096, 8192] @ [8192, 8192] in bf16: 2 * 4096 * 8192 * 8192 = 549,755,813,888 FLOPs at 989.4e12 x 0.75
    # = 0.740862 ms; its bytes, (4096*8192 + 8192*8192 + 4096*8192) * 2 = 268,435,456, at 3.35e12 x 0.68 take
    # 0.117838 ms: compute-bound
    macs = 4096 * 8192 * 8192
    op = _op("aten.mm", macs=macs, flops=2 * macs, read=(4096 * 8192 + 8192 * 8192) * 2, written=4096 * 8192 * 2)
    assert op_seconds(op, H100, "bfloat16", FRACTIONS) == pytest.approx(549_755_813_888 / (989.4e12 * 0.75))
    # the same in float32 without TF32: 67e12 x 0.75
    assert op_seconds(op, H100, "float32", FRACTIONS) == pytest.approx(549_755_813_888 / (67e12 * 0.75))


def test_memory_bound_attention_launch_and_free():
    # an elementwise add of two 64 MiB bf16 tensors: 192 MiB moved at 3.35e12 x 0.68 = 88.38 us
    add = _op("aten.add", flops=2**25, read=2**27, written=2**26)
    assert op_seconds(add, H100, "bfloat16", FRACTIONS) == pytest.approx(3 * 2**26 / (3.35e12 * 0.68))
    # SDPA without its shape: its executed FLOPs at the rate of head dim 128 (forward: the attention fraction,
    # 0.70, x 1.0; backward x 0.88), plus a launch; causal, counted dense, the kernel runs the kept share
    sdpa = _op("aten._scaled_dot_product_flash_attention", flops=10**12, read=10**6)
    assert op_seconds(sdpa, H100, "bfloat16", FRACTIONS) == pytest.approx(1e12 / (989.4e12 * 0.7) + 4e-6)
    sdpa = _op("aten._scaled_dot_product_flash_attention", flops=10**12, read=10**6, executed=0.5)
    assert op_seconds(sdpa, H100, "bfloat16", FRACTIONS) == pytest.approx(0.5e12 / (989.4e12 * 0.7) + 4e-6)
    sdpa = _op("aten._scaled_dot_product_flash_attention_backward", flops=10**12, read=10**6, phase="backward")
    assert op_seconds(sdpa, H100, "bfloat16", FRACTIONS) == pytest.approx(1e12 / (989.4e12 * 0.7 * 0.88) + 4e-6)
    # a tiny op costs one launch; a view and the profiler's marks nothing
    assert op_seconds(_op("aten.neg", flops=1, read=4, written=4), H100, "bfloat16", FRACTIONS) == 4e-6
    assert op_seconds(_op("aten.view", status="free"), H100, "bfloat16", FRACTIONS) == 0.0
    assert op_seconds(_op("profiler._record_function_exit", status="uncounted"), H100, "bfloat16", FRACTIONS) == 0.0


def _sdpa(batch_heads, s, d, causal, backward, dropout=False):
    """The op the cost formula gives for SDPA on [batch_heads, s, d] (heads of d for Q, K and V)."""
    from layerscope.costs.attention import _causal_scores, attention_cost
    c = attention_cost(batch_heads * s * s, d, d, bias=False, backward=backward, rows=batch_heads * s,
                       masked=causal, dropout=dropout)
    executed = _causal_scores(s, s) / (s * s) if causal else 1.0
    return _op("aten._scaled_dot_product_cudnn_attention" + "_backward" * backward, macs=c.macs, flops=c.flops,
               read=4 * batch_heads * s * d * 2, phase="backward" if backward else "forward", executed=executed,
               attention=c.attention)


def test_attention_by_head_dim_tile_and_rows_by_hand():
    # 64 heads of 2,048 tokens at d 80, causal, forward. Kept scores 64 x 2048 x 2049 / 2 = 134,283,264, plus
    # 320 a query row (causal forward) x 64 x 2048 = 41,943,040: 176,226,304. Each runs at the tile's head
    # dims, 128 for Q.K and for P.V: 2 x (128 + 128) = 512 FLOPs, 90,227,867,648 in all, at 989.4e12 x 0.70
    # x 1.0 (tile 128's forward) = 130.28 us, plus a 4 us launch
    op = _sdpa(64, 2048, 80, True, False)
    assert op_seconds(op, H100, "bfloat16", FRACTIONS) == pytest.approx(90_227_867_648 / (989.4e12 * 0.7) + 4e-6)
    # the backward, not masked, d 64: 64 x 2048^2 = 268,435,456 scores + 448 x 131,072 rows = 327,155,712, at
    # 2 x (3 x 64 + 2 x 64) = 640 FLOPs: 209,379,655,680, at 989.4e12 x 0.70 x 0.65 (tile 64's backward)
    op = _sdpa(64, 2048, 64, False, True)
    assert op_seconds(op, H100, "bfloat16", FRACTIONS) == pytest.approx(
        209_379_655_680 / (989.4e12 * 0.7 * 0.65) + 4e-6)


# cuDNN's SDPA kernels timed on one H100 80GB HBM3 (torch 2.11.0+cu130, cuDNN 9.19, bf16; CUDA events over
# 20 calls after 3 warm-ups; bench/bench_gpu.py part 7, 2026-11-26): (batch x heads, length, head dim,
# causal, forward us, backward us)
H100_SDPA = [(128, 1024, 64, True, 63.8, 214.3), (64, 2048, 80, True, 142.4, 433.1),
             (64, 2048, 128, True, 143.5, 476.1), (32, 4096, 64, False, 297.3, 778.7),
             (128, 1024, 96, False, 116.1, 402.2), (32, 4096, 256, False, 757.5, 3498.0)]


@pytest.mark.parametrize("bh, s, d, causal, fwd_us, bwd_us", H100_SDPA)
def test_attention_against_h100_kernels(bh, s, d, causal, fwd_us, bwd_us):
    # a flat fraction of the FLOPs missed these by up to 2x: a head of 64 runs at two thirds of 128's rate,
    # a head of 80 as slowly as 128, and a short sequence pays each query row's fixed cost
    for backward, us in ((False, fwd_us), (True, bwd_us)):
        got = op_seconds(_sdpa(bh, s, d, causal, backward), H100, "bfloat16", FRACTIONS)
        assert got == pytest.approx(us * 1e-6, rel=0.16), (backward, got * 1e6, us)


# the same kernels with dropout_p 0.1, on another lent H100 (same image, 2026-11-26): (batch x heads,
# length, head dim, causal, forward us, backward us; without dropout there: 76.1 / 257.2, 212.4 / 702.5,
# 255.6 / 787.6)
H100_SDPA_DROPOUT = [(160, 1024, 64, True, 165.3, 302.3), (64, 2048, 128, False, 487.0, 923.2),
                     (32, 4096, 128, True, 539.2, 962.9)]


@pytest.mark.parametrize("bh, s, d, causal, fwd_us, bwd_us", H100_SDPA_DROPOUT)
def test_attention_dropout_against_h100_kernels(bh, s, d, causal, fwd_us, bwd_us):
    # a random number per kept score doubles the forward: priced without it, these were 53-57% under
    # (backward 17-26%)
    for backward, us in ((False, fwd_us), (True, bwd_us)):
        got = op_seconds(_sdpa(bh, s, d, causal, backward, dropout=True), H100, "bfloat16", FRACTIONS)
        assert got == pytest.approx(us * 1e-6, rel=0.12), (backward, got * 1e6, us)


def test_attention_dropout_by_hand():
    # 64 heads of 1,024 tokens at d 128, not masked, forward, dropout: scores 67,108,864 + 160 x 65,536 rows =
    # 77,594,624 at 2 x 256 FLOPs = 39,728,447,488 at 989.4e12 x 0.70 x 1.0 (57.36 us), plus the 67,108,864
    # kept scores' random numbers at 69 FLOPs each on the float32 peak, 4,630,511,616 / 67e12 (69.11 us: 1.03
    # ps a score), plus a 4 us launch
    op = _sdpa(64, 1024, 128, False, False, dropout=True)
    assert op_seconds(op, H100, "bfloat16", FRACTIONS) == pytest.approx(
        39_728_447_488 / (989.4e12 * 0.7) + 4_630_511_616 / 67e12 + 4e-6)
    # --fraction attention=1 prices a tile of 256 at the peak, not above it (its measured scale is 1.06)
    op = _sdpa(64, 1024, 256, False, False)
    one = fractions({"attention": 1.0})
    assert op_seconds(op, H100, "bfloat16", one) == pytest.approx(
        2 * (64 * 1024 * 1024 + 160 * 65_536) * 512 / 989.4e12 + 4e-6)


def test_collectives_by_link():
    # all-gather of 1 GiB over 8 ranks within a node: 7/8 GiB through each rank at 450e9 x 0.8, plus 7 hops of 3 us
    ring = 2**30 * 7 / 8
    assert collective_seconds(ring, 8, "nvlink", H100, FRACTIONS) == pytest.approx(ring / 360e9 + 7 * 3e-6)
    # across nodes: 50e9 x 0.8 and 8 us a hop
    assert collective_seconds(ring, 8, "network", H100, FRACTIONS) == pytest.approx(ring / 40e9 + 7 * 8e-6)
    assert collective_seconds(ring, 1, "network", H100, FRACTIONS) == 0.0
    # the mesh [pp, replicate, fsdp, tp], tp innermost, 8 GPUs a node
    c = ParallelConfig(gpus=64, tp=8)                       # fsdp 8 spans 8 nodes, one member on each
    assert (link_of(c, "tp"), link_of(c, "fsdp")) == (("nvlink", 1), ("network", 1))
    c = ParallelConfig(gpus=64, tp=2, replicate=16)         # fsdp 2 x tp 2 within a node, replicas across
    assert (link_of(c, "fsdp"), link_of(c, "replicate")) == (("nvlink", 1), ("network", 2))
    # FSDP 64 alone: 8 members a node, whose 8 NICs carry what enters the node: 8 x 50e9 = 400e9 (under
    # NVLink's 450e9), x 0.8; 63 hops of 8 us. With a faster network, NVLink's 450e9 caps it
    c = ParallelConfig(gpus=64)
    assert link_of(c, "fsdp") == ("network", 8)
    assert collective_seconds(ring, 64, link_of(c, "fsdp"), H100, FRACTIONS) == pytest.approx(
        ring / (400e9 * 0.8) + 63 * 8e-6)
    assert collective_seconds(ring, 64, ("network", 8), gpu("H100", network=100e9), FRACTIONS) == pytest.approx(
        ring / (450e9 * 0.8) + 63 * 8e-6)


def test_fractions_override_and_refusals():
    f = fractions({"matmul": 0.5})
    assert f["matmul"] == 0.5 and f["memory"] == FRACTIONS["memory"]
    with pytest.raises(InputError, match="unknown step-time fraction 'gemm'"):
        fractions({"gemm": 0.5})
    with pytest.raises(InputError, match=r"in \(0, 1\]"):
        fractions({"matmul": 1.5})


# a device where bytes are seconds: 1e9 B/s everywhere, every fraction 1, no latency or launch floor
UNIT = GPU("unit", 80 << 30, (9, 0), 1e9, MappingProxyType({"float32": 1e12, "bfloat16": 1e12}), 1e9, 1e9)
UNIT_F = fractions({"matmul": 1, "attention": 1, "memory": 1, "link": 1, "launch_s": 0, "nvlink_latency_s": 0,
                    "network_latency_s": 0, "host_op_s": 0, "host_tp_op_s": 0, "host_sac_op_s": 0})


def _run(ops, config, param_bytes=None, optimizer_bytes=None):
    trace = SimpleNamespace(ops=ops)
    run = SimpleNamespace(passes=[SimpleNamespace(step=1, micro=0, trace=trace)], param_bytes=param_bytes or {},
                          optimizer_bytes=optimizer_bytes or {}, optimizer_other_bytes=0, grad_bytes={})
    return SimpleNamespace(run=run, p2p=None)


def test_fsdp_overlap_two_streams_by_hand():
    """FSDP 2 (one node): all-gathers of 2 GB gathered (1 GB through a rank: 1 s), compute ops of 2 s, a
    reduce-scatter of 2 GB (1 s). Program order: AG0, C0, AG1, C1, RS1. By hand: AG0 0-1 s, C0 waits, 1-3 s;
    AG1 is issued when C0 starts (1 s), runs 1-2 s, hidden; C1 3-5 s; RS1 after C1, 5-6 s. The step: 6 s,
    4 s of compute, 2 s of FSDP communication exposed (AG0 and RS1); TP none."""
    c = ParallelConfig(gpus=2)
    ag = dict(written=2 * 10**9)
    ops = [_op("c10d._allgather_base_", **ag), _op("aten.add", read=2 * 10**9),
           _op("c10d._allgather_base_", **ag), _op("aten.add", read=2 * 10**9, phase="backward"),
           _op("c10d._reduce_scatter_base_", read=2 * 10**9, phase="backward")]
    s = rank_seconds(_run(ops, c), c, UNIT, UNIT_F)
    assert (s.end, s.forward, s.backward, s.fsdp, s.exposed_fsdp, s.tp) == pytest.approx((6, 2, 2, 3, 2, 0))
    st = assemble({0: s}, 0.0, c, UNIT, tokens=12, f=UNIT_F)
    assert st.step_time == pytest.approx(6) and st.tokens_per_s == pytest.approx(2)


def test_tp_collectives_are_on_the_critical_path():
    """TP 2: a compute op of 1 s, an all-reduce of 1 GB (2 x 1/2 GB through a rank: 1 s), a compute op
    of 1 s: 3 s, nothing hidden."""
    c = ParallelConfig(gpus=2, tp=2)
    ops = [_op("aten.add", read=10**9), _op("_c10d_functional.all_reduce", read=10**9), _op("aten.add", read=10**9)]
    s = rank_seconds(_run(ops, c), c, UNIT, UNIT_F)
    assert (s.end, s.tp) == pytest.approx((3, 1))


def test_pipeline_goes_through_the_schedule():
    """pp 2, 1F1B, 2 micro-batches, each stage 1 s forward and 2 s backward per micro-batch, no sends: by
    hand (stage 0: F0 0-1, F1 1-2; stage 1: F0 1-2, B0 2-4, F1 4-5, B1 5-7; stage 0: B0 4-6, B1 7-9): 9 s;
    busy 6 s each of 2 x 9 s: bubble 1/3."""
    c = ParallelConfig(gpus=2, pp=2, microbatches=2)
    s = SimpleNamespace(forward=2.0, backward=4.0, host_forward=0.0, host_backward=0.0, tp=0.0, fsdp=0.0,
                        exposed_fsdp=0.0, optimizer=0.0, end=6.0, uncounted_ops=0, forward_flops=0)
    st = assemble({0: s, 1: s}, 0.0, c, UNIT, tokens=None, f=UNIT_F)
    assert st.step_time == pytest.approx(9) and st.bubble == pytest.approx(1 / 3)


def test_the_gpu_waits_for_the_host_by_hand():
    """The host issues every op, a view too, at host_op_s each (here 1 s); a kernel starts once issued.
    Ops: add (0.5 s), view, add (0.5 s), add (0.5 s). By hand: the host issues them at 1, 2, 3, 4 s; the
    GPU runs 1-1.5, 3-3.5, 4-4.5: 4.5 s, 1.5 s of compute, 3 s waiting for the host (1 + 1.5 + 0.5)."""
    c = ParallelConfig(gpus=2)
    f = fractions({**UNIT_F, "host_op_s": 1.0})
    half = dict(read=5 * 10**8)
    ops = [_op("aten.add", **half), _op("aten.view", status="free"), _op("aten.add", **half),
           _op("aten.add", phase="backward", **half)]
    s = rank_seconds(_run(ops, c), c, UNIT, f)
    assert (s.end, s.forward, s.backward, s.host_forward, s.host_backward, s.exposed_fsdp) == pytest.approx(
        (4.5, 1.0, 0.5, 2.5, 0.5, 0))
    st = assemble({0: s}, 0.0, c, UNIT, tokens=None, f=f)
    assert (st.step_time, st.compute, st.host_wait) == pytest.approx((4.5, 1.5, 3.0))
    # the GPU slower than the host: no wait (2 s a kernel, 1 s an issue: 1-3, 3-5, 5-7 after the first)
    slow = dict(read=2 * 10**9)
    s = rank_seconds(_run([_op("aten.add", **slow)] * 3, c), c, UNIT, f)
    assert (s.end, s.host_forward) == pytest.approx((7, 1))


def test_host_cost_per_op_by_configuration():
    f = FRACTIONS
    assert host_op_seconds(ParallelConfig(gpus=8), f) == f["host_op_s"]
    assert host_op_seconds(ParallelConfig(gpus=8, ac="full"), f) == f["host_op_s"]
    assert host_op_seconds(ParallelConfig(gpus=8, ac="selective-op"), f) == f["host_sac_op_s"]
    assert host_op_seconds(ParallelConfig(gpus=8, tp=2), f) == f["host_tp_op_s"]


def test_optimizer_passes_by_hand():
    """torch's foreach updates, parameter-sized passes a step: AdamW's lerp_ (m, g -> m: 3), mul_ (v: 2),
    addcmul_ (v, g -> v: 3), sqrt (v -> t: 2), div_ (t: 2), add_ (t: 2), addcdiv_ (p, m, t -> p: 4) and the
    weight decay's mul_ (p: 2) = 20; SGD with momentum's mul_ (2), add_ (3) and the update's add_ (3) = 8;
    plain SGD's add_ = 3. 1 GB of parameters at 1e9 B/s: 20, 8 and 3 s."""
    c = ParallelConfig(gpus=2)
    for state, seconds in ((2 * 10**9, 20), (10**9, 8), (0, 3)):
        run = _run([], c, param_bytes={"w": 10**9}, optimizer_bytes={"w": state} if state else {})
        assert rank_seconds(run, c, UNIT, UNIT_F).optimizer == pytest.approx(seconds)
