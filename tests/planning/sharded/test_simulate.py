"""parallel(): a rank's memory under FSDP2, simulated with torch's own code on a fake process group.
Expected values are derived by hand from FSDP2's sharding rules (beside each assertion)."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import layerscope
from layerscope.errors import InputError

from ...helpers import assert_unchanged, snapshot


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(64, 256)
        self.fc2 = nn.Linear(256, 64)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(64, 10)

    def forward(self, x):
        for b in self.layers:
            x = b(x)
        return self.head(x)


# Parameters: a block 256x64 + 256 + 64x256 + 64 = 33,088 (132,352 B in fp32); the head 10x64 + 10 = 650.
# FSDP2 shards dim 0 in ceil(n / 4) chunks: a block's rows split evenly (64, 64, 16, 16 rows per rank);
# the head's 10 rows as 3, 3, 3, 1, each rank's shard padded to 3 rows (its storage: 3x64x4 + 3x4 = 780 B).
BLOCK_B, HEAD_PADDED_B = 33_088 * 4, (3 * 64 + 3) * 4


def test_fsdp_shards_and_collectives_by_hand():
    torch.manual_seed(0)
    m, x = Net(), torch.randn(8, 64)
    before = snapshot(m)
    rep = layerscope.parallel(m, x, gpus=4, mixed_precision="off", optimizer="adamw", device="cpu")
    assert_unchanged(before, m)
    assert not dist.is_initialized()                     # the fake process group is gone
    plan = rep.plan
    assert (plan.fsdp, plan.tp, plan.pp, plan.local_batch) == (4, 1, 1, 8)
    r0, r3 = plan.ranks[0], plan.ranks[3]
    # every rank's parameter storage is padded to the same size: 3 blocks / 4 + the padded head
    for r in plan.ranks:
        assert r.breakdown["sharded parameters"] == 3 * BLOCK_B // 4 + HEAD_PADDED_B == 100_044
    # AdamW's exp_avg and exp_avg_sq follow the unpadded local shard, plus a 4-byte step per parameter
    # (8 parameters in the blocks... 3 x 4 + 2 = 14): rank 0 holds 3 head rows, rank 3 one
    assert r0.breakdown["optimizer state"] == 2 * 100_044 + 14 * 4 == 200_144
    assert r3.breakdown["optimizer state"] == 2 * (3 * BLOCK_B // 4 + 64 * 4 + 4) + 14 * 4 == 199_104
    # ranks 0-2 share a role; rank 3's head shard is shorter, so it was simulated too
    assert [r.simulated_as for r in plan.ranks] == [0, 0, 0, 3]
    # collectives per step: the root's gather once (it stays gathered, reshard_after_forward=False at
    # the root), each block gathered in forward and again in backward: 1 + 3 + 3 = 7; each block and
    # the root reduce-scattered once: 4. Gathered bytes: 6 x 132,352 + 4 x 780.
    coll = {c.kind: c for c in r0.collectives}
    ag, rs = coll["all-gather"], coll["reduce-scatter"]
    assert (ag.calls, ag.bytes_written, ag.bytes_read) == (7, 6 * BLOCK_B + 4 * HEAD_PADDED_B, (6 * BLOCK_B + 4 * HEAD_PADDED_B) // 4)
    assert (rs.calls, rs.bytes_read, rs.bytes_written) == (4, 3 * BLOCK_B + 4 * HEAD_PADDED_B, 100_044)
    # a ring moves 3/4 of the gathered tensor through each rank
    assert ag.ring_bytes == ag.bytes_written * 3 // 4 and ag.group_size == 4
    # what the table shows sums to the peak
    assert sum(r0.breakdown.values()) == r0.peak_bytes


def test_gathered_parameters_follow_reshard_after_forward():
    m, x = Net(), torch.randn(8, 64)
    # the fake backend: no gloo buffers, so the peak is the backward's
    on = layerscope.parallel(m, x, gpus=4, mixed_precision="off", device="cpu", backend="fake").plan.ranks[0]
    off = layerscope.parallel(m, x, gpus=4, mixed_precision="off", device="cpu", backend="fake",
                              reshard_after_forward=False).plan.ranks[0]
    # resharded after forward, the backward of a block gathers it alone (plus the root's head, kept):
    # at the peak at most one block and the head are gathered; without it, all three blocks stay
    # gathered from forward into backward
    assert on.breakdown["gathered parameters"] <= BLOCK_B + 4 * HEAD_PADDED_B
    assert off.breakdown["gathered parameters"] >= 3 * BLOCK_B
    off_ag = {c.kind: c for c in off.collectives}["all-gather"]
    assert off_ag.calls == 4                       # no re-gather in backward: the root and 3 blocks


def test_mixed_precision_gathers_bf16():
    m, x = Net(), torch.randn(8, 64)
    r = layerscope.parallel(m, x, gpus=4, device="cpu").plan.ranks[0]     # bf16 compute, fp32 master
    ag = {c.kind: c for c in r.collectives}["all-gather"]
    # the same gathers in bf16: half the bytes
    assert ag.bytes_written == (6 * BLOCK_B + 4 * HEAD_PADDED_B) // 2
    assert r.breakdown["sharded parameters"] == 100_044                   # fp32 master shards
    rs = {c.kind: c for c in r.collectives}["reduce-scatter"]
    assert rs.bytes_read == 3 * BLOCK_B + 4 * HEAD_PADDED_B               # reduced in fp32 (reduce_dtype)


def test_every_degree_one_is_memory_to_the_byte():
    m, x = Net(), torch.randn(8, 64)
    rep = layerscope.parallel(m, x, gpus=1, mixed_precision="off", optimizer="adamw", device="cuda")
    # parallel() lets go of the output before the backward, as torchtitan's step does (and on every rank)
    mem = layerscope.memory(m, x, optimizer="adamw", device="cuda", keep_output=False)
    assert rep.plan.peak_bytes == mem.peak_bytes
    kept = layerscope.memory(m, x, optimizer="adamw", device="cuda")
    assert kept.peak_bytes >= mem.peak_bytes
    assert rep.plan.ranks[0].breakdown["optimizer state"] == mem.peak_step.breakdown["optimizer_state"]
    assert "no sharding" in rep.notes[0]


def test_limit_and_json():
    m, x = Net(), torch.randn(8, 64)
    rep = layerscope.parallel(m, x, gpus=4, mixed_precision="off", device="cpu", memory_limit=800_000)
    plan = rep.plan
    assert plan.fits is False and plan.over_bytes == plan.peak_bytes - 800_000 > 0
    import json
    d = json.loads(rep.to_json())
    p = d["plans"][0]
    assert d["kind"] == "parallel" and d["schema"] == 6
    assert (p["fsdp"], p["tp"], p["pp"], p["ac"], p["microbatches"], p["step_time"], p["mfu"]) == (4, 1, 1, "none", 1, None, None)
    assert [r["rank"] for r in p["ranks"]] == [0, 1, 2, 3]
    assert p["ranks"][3]["coords"] == {"pp": 0, "dp_replicate": 0, "dp_shard": 3, "tp": 0}


def test_bad_configurations_are_one_line():
    m, x = Net(), torch.randn(8, 64)
    for kw, needle in (({"gpus": 6, "tp": 4}, "multiple of"),
                       ({"gpus": 4, "pp": 2, "schedule": "zbv", "ac": "selective-op"},
                        "refuses under selective-op checkpointing"),
                       ({"gpus": 2, "ac": "sometimes"}, "ac must be"), ({"gpus": 2, "device": "tpu"}, "cuda or cpu"),
                       ({"gpus": 16, "tp": 16}, "fit in a node"),
                       ({"gpus": 4, "pp": 2, "schedule": "zb"}, "needs reshard_after_forward off"),
                       ({"gpus": 2, "pp": 2, "schedule": "zbv", "stages_per_rank": 3},
                        "exactly 2 stages on each rank: leave stages_per_rank"),
                       ({"gpus": 2, "tp": 2, "offload": True}, "offload is FSDP2's CPU offload")):
        with pytest.raises(InputError, match=needle):
            layerscope.parallel(m, x, **kw)
    assert not dist.is_initialized()


def test_cli_parallel(capsys):
    from layerscope.cli import main
    assert main(["parallel", "hf:LlamaConfig", "--head", "causal-lm", "--set", "num_hidden_layers=2",
                 "--set", "hidden_size=64", "--set", "intermediate_size=128", "--set", "num_attention_heads=4",
                 "--set", "num_key_value_heads=2", "--set", "vocab_size=256", "--input-ids", "2,32", "--gpus", "4",
                 "--gpu", "H100", "-q"]) == 0
    out = capsys.readouterr().out
    assert "fsdp 4, tp 1, pp 1" in out and "all-gather (fsdp, 4)" in out and "NCCL~" in " ".join(out.split())
    assert main(["parallel", "hf:LlamaConfig", "--input-ids", "2,32", "--gpus", "3", "--tp", "2", "-q"]) == 1
    assert "multiple of" in capsys.readouterr().err


def test_the_model_comes_out_unchanged_from_every_path():
    # tensor parallel with selective checkpointing (transformers' Llama, its use_cache on), one device
    # with checkpointing, and a configuration refused after the meta copy was made
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=128)
    m = transformers.LlamaForCausalLM(cfg)
    m.register_forward_hook(lambda *a: None)
    odd = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=127))
    ids = torch.randint(0, 127, (2, 16))
    before, before_odd = snapshot(m), snapshot(odd)
    layerscope.parallel(m, input_ids=ids, labels=ids, gpus=4, tp=2, ac="selective-op", device="cpu")
    layerscope.parallel(m, input_ids=ids, labels=ids, gpus=1, ac="full", device="cpu")
    with pytest.raises(InputError, match="vocabulary"):
        layerscope.parallel(odd, input_ids=ids, labels=ids, gpus=2, tp=2)
    assert_unchanged(before, m)
    assert_unchanged(before_odd, odd)
    assert m.config.use_cache and not dist.is_initialized()


def test_estimate_lines_by_hand():
    # on CUDA ranks: NCCL's buffers, 16 channels x 4 MiB per communicator, one communicator (the dp_shard
    # dimension): 67,108,864 B; cuBLAS's workspaces are simulated (a part), not estimated: two of 32 MiB
    # on an H100 (sm 9.0), the forward's thread and the backward's (costs/cublas.py)
    r = layerscope.parallel(Net(), torch.randn(8, 64), gpus=4, mixed_precision="off", gpu="H100").plan.ranks[0]
    assert r.breakdown["NCCL buffers (estimate)"] == 16 * 4 * 2**20
    assert r.breakdown["workspaces"] == 2 * 32 * 2**20
    assert r.peak_bytes == r.simulated_peak_bytes + 16 * 4 * 2**20
    # an A100 (sm 8.0): 4096 KiB x 2 + 16 KiB x 8 each
    a = layerscope.parallel(Net(), torch.randn(8, 64), gpus=4, mixed_precision="off", gpu="A100").plan.ranks[0]
    assert a.breakdown["workspaces"] == 2 * (4096 * 1024 * 2 + 16 * 1024 * 8)
    # the fake backend has no NCCL; CPU ranks (gloo) have neither NCCL's buffers nor workspaces
    f = layerscope.parallel(Net(), torch.randn(8, 64), gpus=4, mixed_precision="off", gpu="H100",
                            backend="fake").plan.ranks[0]
    assert f.peak_bytes == f.simulated_peak_bytes and f.breakdown["NCCL buffers (estimate)"] == 0
    assert f.breakdown["gloo late free (estimate)"] == 0
    rep = layerscope.parallel(Net(), torch.randn(8, 64), gpus=4, mixed_precision="off", device="cpu")
    c = rep.plan.ranks[0]
    assert c.breakdown["workspaces"] == 0 and c.breakdown["NCCL buffers (estimate)"] == 0
    # but gloo's reduce-scatter clone its worker may free late: the largest reduce-scatter input, a
    # block's gradients unsharded (33,088 fp32 elements, every dim 0 divisible by 4: 132,352 B; the
    # head's group is 12 x 64 + 12 padded rows: 3,120 B)
    assert c.breakdown["gloo late free (estimate)"] == 132_352
    assert c.peak_bytes == c.simulated_peak_bytes + 132_352
    assert any("up to 132,352 B more" in n for n in rep.notes)


def test_cpu_offload_moves_shards_gradients_and_the_optimizer_to_the_host_by_hand():
    # FSDP2's CPU offload on 4 GPUs, fp32, AdamW, rank 0; every host tensor rounded to 512 B as the
    # simulation's CUDA blocks are. At the host's peak (the optimizer step):
    # - the shards: per block fc1.weight 64x64 and fc2.weight 16x256 (16,384 B each), two biases of 64 B
    #   (512 B each); the head's 3x64 (768 -> 1,024 B) and 3 (12 -> 512 B): 3 x 33,792 + 1,536 = 102,912
    # - the reduced gradients, copied out of each group's reduce-scatter output whole (its padded flat
    #   buffer): a block's 33,088 B -> 33,280, the head's 780 -> 1,024: 3 x 33,280 + 1,024 = 100,864
    # - AdamW's state: exp_avg and exp_avg_sq like the shards (2 x 102,912): 205,824; its 14 0-dim steps are
    #   CPU tensors on a CUDA rank too (torch.tensor(0.0) unless fused or capturable), not counted anywhere
    # - single-tensor AdamW's (the default off CUDA tensors) temporaries for one 64x64 shard: its sqrt
    #   and the division of it (16,384 B each) and the 0-dim bias correction (512): 33,280
    m, x = Net(), torch.randn(8, 64)
    before = snapshot(m)
    on = layerscope.parallel(m, x, gpus=4, mixed_precision="off", gpu="H100", backend="fake", offload=True)
    assert_unchanged(before, m)
    off = layerscope.parallel(m, x, gpus=4, mixed_precision="off", gpu="H100", backend="fake")
    r, o = on.plan.ranks[0], off.plan.ranks[0]
    assert r.host_bytes == 102_912 + 100_864 + 205_824 + 33_280 == 442_880
    assert o.breakdown["sharded parameters"] == 102_912 and o.breakdown["optimizer state"] == 205_824
    # on the device: no shards and no optimizer state; its peak lower than without offload
    assert r.breakdown["sharded parameters"] == r.breakdown["optimizer state"] == 0
    assert r.peak_bytes < o.peak_bytes and o.host_bytes == 0
    assert sum(r.breakdown.values()) == r.peak_bytes
    assert on.plan.offload and "CPU offload" in on.plan.label
    assert any("442,880 B per rank" in n for n in on.notes)
    import json
    d = json.loads(on.to_json())
    assert d["schema"] == 6 and d["plans"][0]["offload"] is True and d["plans"][0]["ranks"][0]["host_bytes"] == 442_880
    # on CPU ranks the host is the device: offload changes no figure
    cpu_on = layerscope.parallel(m, x, gpus=4, mixed_precision="off", device="cpu", offload=True).plan.ranks[0]
    cpu_off = layerscope.parallel(m, x, gpus=4, mixed_precision="off", device="cpu").plan.ranks[0]
    assert (cpu_on.peak_bytes, cpu_on.breakdown, cpu_on.host_bytes) == (cpu_off.peak_bytes, cpu_off.breakdown, 0)


def test_dtensor_random_state_of_an_earlier_run_is_put_aside():
    # A real DTensor run on a CUDA mesh leaves torch's process-wide RNG tracker behind
    # (torch.distributed.tensor._random._rng_tracker); a simulation's dropout on its CPU mesh must not
    # drive it (seen on a GPU host: "data is not allocated yet" from fake tensors). A stand-in that fails
    # when touched: the simulation runs without it and gives it back.
    import torch.distributed.tensor._random as rnd
    from layerscope.specs import build_model

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError(f"the simulation touched an earlier run's RNG tracker ({name})")
    model = build_model("hf:GPT2Config", "meta", {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 128,
                                                  "n_positions": 64}, "causal-lm").model
    ids = torch.randint(0, 128, (2, 16))
    before, stand_in = rnd._rng_tracker, Untouchable()
    rnd._rng_tracker = stand_in
    try:
        rep = layerscope.parallel(model, ids, gpus=2, tp=2, ac="full", device="cpu")
        assert rep.plan.peak_bytes > 0 and rnd._rng_tracker is stand_in
    finally:
        rnd._rng_tracker = before
