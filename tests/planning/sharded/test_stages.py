"""Pipeline stages in the per-rank simulation (planning/simulate/pipeline_rank.py): a rank's schedule run on fake tensors.
Expected values derived by hand beside each assertion."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

from layerscope.errors import InputError
from layerscope.planning.config import ParallelConfig
from layerscope.planning.simulate.pipeline_rank import simulate_stage_rank
from layerscope.planning.simulate.sharded_rank import RankStep
from layerscope.planning.simulate.uniform_stages import stage_blocks


from .test_simulate import Block   # noqa: E402  (the same block: 64 -> 256 -> 64 with a residual)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(32, 64)
        self.layers = nn.ModuleList([Block() for _ in range(4)])
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        x = self.embed(x)
        for b in self.layers:
            x = b(x)
        return self.head(x)


# One micro-batch is 256 / 4 = 64 rows. Stage 0 owns embed and blocks 0-1; per micro-batch its forward
# keeps for backward: the embedding's output (block 0's fc1 input, 64x64 fp32 = 16,384 B), per block
# the ReLU's output (fc2's input and the ReLU's own saved result, 64x256x4 = 65,536 B) and the block's
# output into the next block (16,384 B; the second block's output is the stage output, an output, not
# an activation): 16,384 + 65,536 + 16,384 + 65,536 = 163,840 B per micro-batch.
PER_MICRO = 163_840


def _max_part(rr, part):
    n = rr.tracker.clock + 1
    diff = [0] * (n + 2)
    for b in rr.tracker.blocks:
        if rr.part(b) != part or not b.nbytes:
            continue
        a, f = max(b.alloc, 0), (n - 1 if b.free is None else b.free)
        diff[a] += b.nbytes
        diff[f + 1] -= b.nbytes
    best = run = 0
    for d in diff:
        run += d
        best = max(best, run)
    return best


@pytest.mark.parametrize("schedule,held", [("gpipe", 4), ("1f1b", 2)])
def test_first_stage_holds_the_schedules_micro_batches(schedule, held):
    torch.manual_seed(0)
    m, x = Net(), torch.randn(256, 32)
    cfg = ParallelConfig(gpus=2, pp=2, schedule=schedule, microbatches=4, mixed_precision="off")
    rr = simulate_stage_rank(m, (x,), {}, cfg, 0, RankStep(optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                                                                      steps=1, loss_fn=None))
    assert not dist.is_initialized()
    # GPipe: all 4 forwards before the first backward; 1F1B on stage 0 of 2: P - s = 2 warm-up forwards
    assert _max_part(rr, "activations") == held * PER_MICRO
    # stage 0 receives the gradients of its output: one 64x64 fp32 buffer per micro-batch, made once
    assert _max_part(rr, "communication buffers") == 4 * 64 * 64 * 4
    # its parameters: embed 32x64 + 64, two blocks 2 x 33,088 -> (2,112 + 66,176) x 4 B
    assert sum(b.nbytes for b in rr.tracker.blocks if rr.part(b) == "sharded parameters") == (2_112 + 66_176) * 4


def test_last_stage_sends_input_gradients_back():
    m, x = Net(), torch.randn(256, 32)
    cfg = ParallelConfig(gpus=2, pp=2, schedule="gpipe", microbatches=4, mixed_precision="off")
    rr = simulate_stage_rank(m, (x,), {}, cfg, 1, RankStep(optimizer=None, steps=1, loss_fn=None))
    # 4 receive buffers of 64x64 fp32, and the 4 input gradients sent back, kept on them to the next step
    assert _max_part(rr, "communication buffers") == 8 * 64 * 64 * 4


def test_interleaved_rank_holds_its_stages_by_hand():
    # pp 2 x 2 stages per rank: 4 stages (embed + block 0 | block 1 | block 2 | block 3 + head); torch's loop
    # placement puts stage s on rank s % 2: rank 0 holds stages 0 and 2, rank 1 stages 1 and 3
    torch.manual_seed(0)
    m, x = Net(), torch.randn(256, 32)
    cfg = ParallelConfig(gpus=2, pp=2, schedule="interleaved", microbatches=4, mixed_precision="off")
    assert cfg.stages == 4
    from ...helpers import assert_unchanged, snapshot
    before = snapshot(m)
    r0, r1 = (simulate_stage_rank(m, (x,), {}, cfg, r, RankStep(optimizer=None, steps=1, loss_fn=None)) for r in (0, 1))
    assert_unchanged(before, m)
    assert not dist.is_initialized()

    def params(rr):
        return sum(b.nbytes for b in rr.tracker.blocks if rr.part(b) == "sharded parameters")
    # embed 32x64 + 64 = 2,112 and blocks 0 and 2 (33,088 each); blocks 1 and 3 and the head 10x64 + 10
    assert params(r0) == (2_112 + 2 * 33_088) * 4
    assert params(r1) == (2 * 33_088 + 650) * 4
    # P2P per step, each a micro-batch's 64x64 fp32 activation or gradient (16,384 B): stage 0 sends 4
    # activations and receives 4 gradients; stages 1 and 2 receive and send 4 each way twice; stage 3
    # receives 4 activations and sends 4 gradients: 12 transfers each way on either rank
    assert r0.p2p == r1.p2p == (12 * 16_384, 12 * 16_384, 12)
    # the receive buffers, made once: rank 0's 4 gradient buffers (stage 0) and 8 (stage 2); a gradient of a
    # received activation lives until it is sent (torch's bwd_cache), at most one at a time here
    assert _max_part(r0, "communication buffers") == 12 * 16_384 + 16_384


def test_zbv_rank_hands_its_turn_over_by_hand():
    # ZBV zero bubble, pp 2: 4 stages in a V, rank 0 holding stages 0 and 3, rank 1 stages 1 and 2; each backward
    # split in I (the input's gradient) and W (the weights')
    torch.manual_seed(0)
    m, x = Net(), torch.randn(256, 32)
    cfg = ParallelConfig(gpus=2, pp=2, schedule="zbv", microbatches=4, mixed_precision="off")
    from ...helpers import assert_unchanged, snapshot
    before = snapshot(m)
    r0, r1 = (simulate_stage_rank(m, (x,), {}, cfg, r, RankStep(optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
                                                                       steps=1, loss_fn=None)) for r in (0, 1))
    assert_unchanged(before, m)
    assert not dist.is_initialized()
    # P2P, each a micro-batch's 64x64 fp32 activation or gradient (16,384 B): on rank 0 stage 0 sends 4
    # activations and receives 4 gradients, stage 3 receives 4 and sends 4; on rank 1 stage 1 receives from
    # stage 0 and stage 2 sends to stage 3, 4 each way, and stage 1 hands its outputs to stage 2 (and stage 2
    # its input gradients to stage 1) on the rank, no transfer: 8 transfers each way on either rank
    assert r0.p2p == r1.p2p == (8 * 16_384, 8 * 16_384, 8)
    # every weight gets its gradient from the W steps: rank 1's blocks 1 and 2, 2 x 33,088 fp32 (64x256 + 256 +
    # 256x64 + 64); rank 0's embed (2,112) and block 0 (stage 0), block 3 and the head (650; stage 3)
    assert _max_part(r1, "gradients") == 2 * 33_088 * 4
    assert _max_part(r0, "gradients") == (2_112 + 2 * 33_088 + 650) * 4


@pytest.mark.slow
def test_zero_bubble_keeps_routed_attention_in_its_recompute():
    # a CUDA target routes SDPA to the kernel torch picks there (cuDNN on an H100); torch's I and W call
    # torch.autograd.grad, which a mode would leave: a checkpointed block's recompute must take the kernel its
    # forward took (CheckpointError, "tensors saved during forward ... recomputation", when it did not)
    import layerscope
    from layerscope.specs import build_model
    llama = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
             "num_key_value_heads": 2, "vocab_size": 128}
    cfg = ParallelConfig(gpus=4, pp=2, ac="full", microbatches=4, schedule="zbv", reshard_after_forward=False)
    rep = layerscope.parallel(build_model("hf:LlamaConfig", "meta", llama, "causal-lm").model,
                              torch.randint(0, 128, (4, 32)), config=cfg, device="cuda", gpu="H100", steps=1)
    assert any("priced as cuDNN attention" in n for n in rep.notes), rep.notes
    assert all(r.peak_bytes > 0 for r in rep.plan.ranks)


def test_uniform_split_and_refusals():
    assert [list(r) for r in stage_blocks(5, 2)] == [[0, 1, 2], [3, 4]]
    with pytest.raises(InputError, match="at least"):
        stage_blocks(1, 2)
    m, x = Net(), torch.randn(8, 32)
    with pytest.raises(InputError, match="pp must be 2 or more"):
        simulate_stage_rank(m, (x,), {}, ParallelConfig(gpus=2, microbatches=2), 0,
                            RankStep(optimizer=None, steps=1, loss_fn=None))


def test_parallel_simulates_each_stage_on_its_first_rank():
    import layerscope
    from ...helpers import assert_unchanged, snapshot
    import sys
    torch.manual_seed(0)
    m, x = Net(), torch.randn(256, 32)
    before, hook = snapshot(m), sys.excepthook
    rep = layerscope.parallel(m, x, gpus=4, pp=2, microbatches=4, schedule="gpipe", mixed_precision="off",
                              device="cpu")
    assert_unchanged(before, m)
    # torch's init_process_group leaves a hook of its own that prefixes tracebacks with "[rank0]: ": put back
    assert sys.excepthook is hook
    ranks = rep.plan.ranks
    assert [r.coords["pp"] for r in ranks] == [0, 0, 1, 1]
    assert [r.simulated_as for r in ranks] == [0, 0, 2, 2]
    # stage 0 holds GPipe's 4 micro-batches of its forward for the backward (PER_MICRO each, above; FSDP
    # shards parameters, not activations); its peak falls inside micro-batch 0's backward, which has
    # freed its last block's part (16,384 + 65,536 B): 4 x 163,840 - 81,920
    assert ranks[0].peak_phase == "backward" and ranks[0].breakdown["activations"] == 4 * PER_MICRO - 81_920
    assert "pipeline stages" in " ".join(rep.notes) and not dist.is_initialized()
    # point to point, per step: the stage boundary is a micro-batch's [64, 64] fp32 activation, 16,384 B;
    # stage 0 sends 4 forward and receives 4 gradients, stage 1 the other way round
    for r in (0, 2):
        c = {x.kind: x for x in ranks[r].collectives}
        assert (c["send"].calls, c["send"].bytes_read, c["recv"].calls, c["recv"].bytes_written) == \
            (4, 4 * 16_384, 4, 4 * 16_384)


class TiedNet(Net):
    """Net with a square embedding whose weight the head shares (GPT-2's tie): stage 0 holds the
    embedding, the last stage the head, each a copy of the one parameter."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(64, 64, bias=False)
        self.head = nn.Linear(64, 64, bias=False)
        self.head.weight = self.embed.weight


@pytest.mark.parametrize("gpus,shard", [(2, 64 * 64 * 4), pytest.param(4, 32 * 64 * 4, marks=pytest.mark.slow)])
def test_weights_tied_across_stages_get_one_all_reduce_of_their_gradient(gpus, shard):
    import layerscope
    from layerscope.planning.simulate.uniform_stages import stage_ties
    m, x = TiedNet(), torch.randn(256, 64)
    config = ParallelConfig(gpus=gpus, pp=2, microbatches=4, mixed_precision="off")
    assert stage_ties(m, config) == [{0: "embed.weight", 1: "head.weight"}]
    rep = layerscope.parallel(m, x, config=config, device="cpu")
    # each stage's copy of the [64, 64] fp32 weight (16,384 B), sharded on dim 0 by FSDP over gpus / 2 ranks:
    # its gradient's shard summed once a step between the two stages; a ring all-reduce over 2 moves
    # 2 x (2 - 1) / 2 of it through each rank
    for r in rep.plan.ranks:
        (tie,) = [c for c in r.collectives if c.op == "tie.all_reduce"]
        assert (tie.kind, tie.group, tie.group_size, tie.calls, tie.bytes_read, tie.ring_bytes) == \
            ("all-reduce", "pp", 2, 1, shard, shard)
    # untied: no such all-reduce
    plain = layerscope.parallel(Net(), torch.randn(256, 32), config=config, device="cpu")
    assert not any(c.op == "tie.all_reduce" for r in plain.plan.ranks for c in r.collectives)


def test_tensor_parallel_stages_one_after_another():
    # each stage is simulated in a fake world of its own; DTensor caches sharding plans by device mesh, and
    # meshes of two worlds compare equal, so the second stage ran on the first world's process groups
    # ("Could not resolve the process group") until the caches were emptied with each world
    pytest.importorskip("transformers")
    import layerscope
    from layerscope.specs import build_model
    over = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128)
    m = build_model("hf:LlamaConfig", "meta", over, "causal-lm").model
    rep = layerscope.parallel(m, torch.zeros(4, 16, dtype=torch.long), gpus=4, tp=2, pp=2, fsdp=1, microbatches=2,
                              device="cpu")
    assert [r.simulated_as for r in rep.plan.ranks] == [0, 0, 2, 2]
    assert all(r.peak_bytes > 0 for r in rep.plan.ranks)


def test_zero_bubble_w_recomputes_a_checkpointed_block_per_parameter_group():
    # torch's stage_backward_weight calls autograd.grad once per parameter group, each a graph task of its own:
    # a non-reentrant checkpoint recomputes the block in each (docs/parallel.md). A block of three Linear layers
    # (3 parameter groups: each weight with its bias): 1 forward, 1 recompute in I, 3 in W
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
    from torch.utils.checkpoint import checkpoint

    class Three(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c, self.calls = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8), 0

        def forward(self, x):
            self.calls += 1
            return self.c(torch.relu(self.b(torch.relu(self.a(x))))) + x
    blk, x = Three(), torch.randn(4, 8, requires_grad=True)
    out = checkpoint(blk, x, use_reentrant=False)
    _, groups = stage_backward_input([out], [torch.ones_like(out)], [x], blk.parameters())
    assert (blk.calls, len(groups)) == (2, 3)
    stage_backward_weight(blk.parameters(), groups)
    assert blk.calls == 5 and all(p.grad is not None for p in blk.parameters())
