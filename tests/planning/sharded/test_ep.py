"""Expert parallel (``ep``), simulated on torch's fake process group: a shrunk Qwen3-MoE's routed experts
sharded across the ep ranks, tokens dispatched and combined with all_to_all_single. Every figure is
derived by hand beside its assertion (the model's parameter counts, the routing assumption's split
sizes); the real gloo runs are in test_ep_real.py."""

import pytest
import torch

import layerscope
from layerscope.errors import InputError
from layerscope.planning.config import ParallelConfig
from layerscope.planning.expert_parallel import routing_counts
from layerscope.planning.steptime.sharded_time import link_of

transformers = pytest.importorskip("transformers")

# 2 decoder layers, every one a MoE block (decoder_sparse_step 1): 4 experts, top-2, hidden 64, expert
# intermediate 32, 4 heads of 16 (2 KV heads), vocabulary 128, fp32
QWEN3_MOE = dict(vocab_size=128, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                 max_position_embeddings=64)
# Parameters by hand. Experts, per layer: gate_up_proj 4 x 64 x 64 = 16,384 + down_proj 4 x 64 x 32 = 8,192
# = 24,576 (98,304 B); two layers 196,608 B. Dense, per layer: q 64x64 4,096, k and v 32x64 2,048 each, o 4,096,
# q_norm and k_norm 16 each, the router 4x64 256, two RMSNorms 64 each = 12,704 (50,816 B); the root's:
# embedding 128x64 8,192, final norm 64, lm_head 8,192 = 16,448 (65,792 B). Dense total 41,856 (167,424 B).
EXPERTS_B, BLOCK_DENSE_B, ROOT_B = 196_608, 50_816, 65_792
DENSE_B = 2 * BLOCK_DENSE_B + ROOT_B
# one rank's tokens: a local batch of 2 x 16 = 32, each with 2 choices: S = 64 rows of 64 fp32 (256 B)
TOKENS, ROW_B = 32, 64 * 4


def qwen3_moe():
    cfg = transformers.Qwen3MoeConfig(**QWEN3_MOE)
    torch.manual_seed(0)
    return transformers.Qwen3MoeForCausalLM(cfg)


def simulate(**kw):
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    return layerscope.parallel(qwen3_moe(), ids, mixed_precision="off", optimizer="adamw", device="cpu",
                               backend="fake", **kw)


def a2a(rank):
    (c,) = [c for c in rank.collectives if c.kind == "all-to-all"]
    return c


def test_routing_counts_by_hand():
    # even: S = 32 x 2 = 64 choices over 4 experts, 16 each; ep 2 holds 2 experts a rank: 32 sent to each rank,
    # 32 received from each, 32 for each local expert (16 from each of the 2 ranks)
    s = routing_counts(32, 2, 4, 2, 1.0)
    assert (s.send, s.receive, s.local) == ((32, 32), (32, 32), (32, 32))
    # skew:2: the hottest expert ceil(2 x 64 / 4) = 32 (= one per token, the cap), the other 3 share 32:
    # 11, 11, 10. The rank holding the hottest (experts 0, 1 counted from it) sends 32 + 11 = 43 to itself and
    # 11 + 10 = 21 to the other, receives 43 from each rank: 86 rows, 64 for its hottest expert, 22 for the other
    s = routing_counts(32, 2, 4, 2, 2.0)
    assert (s.send, s.receive, s.local) == ((43, 21), (43, 43), (64, 22))
    # not dividing: 5 tokens x 2 = 10 choices: the hottest ceil(2.5) = 3, the rest 7 as 3, 2, 2
    s = routing_counts(5, 2, 4, 4, 1.0)
    assert (s.send, s.local) == ((3, 3, 2, 2), (12,))
    # an expert receives at most one of a token's choices: skew at most E / k = 2
    with pytest.raises(InputError, match="at most one of each token's 2"):
        routing_counts(32, 2, 4, 2, 2.5)


@pytest.mark.slow        # fast-suite budget (make test under 5 min on 2 cores)
def test_without_ep_fsdp_gathers_the_experts_and_the_routing_changes_nothing():
    # without expert parallel the routing changes no figure: transformers' grouped_mm experts (5.24's default)
    # take every choice in one grouped matmul, and no data-dependent op (nonzero) is taken as "all nonzero"
    ep1 = simulate(gpus=2, routing="skew:2")
    base = ep1.plan.ranks[0]
    ep1_notes = " ".join(str(n) for n in ep1.notes)
    assert "without expert parallel no figure depends on the routing" in ep1_notes and "nonzero" not in ep1_notes
    # FSDP 2 alone: half of every parameter, 182,016 B (as under ep 2 below); it gathers the experts with their
    # block: 65,792 + 4 x (50,816 + 98,304) = 662,272; no all-to-all
    assert base.breakdown["sharded parameters"] == EXPERTS_B // 2 + DENSE_B // 2 == 182_016
    assert {c.kind: c for c in base.collectives}["all-gather"].bytes_written == ROOT_B + 4 * (
        BLOCK_DENSE_B + EXPERTS_B // 2) == 662_272
    assert not [c for c in base.collectives if c.kind == "all-to-all"]


def test_fsdp_x_ep_two_ranks_by_hand():
    rep = simulate(gpus=2, ep=2)
    assert "ep 2 (routing even)" in rep.table()
    r0 = rep.plan.ranks[0]
    # ep 2 borrows both FSDP ranks (efsdp 1): each rank holds 2 of 4 experts, whole, and half of the dense
    # parameters: 98,304 + 83,712 = 182,016 B (as FSDP 2 alone: half of everything)
    assert r0.breakdown["sharded parameters"] == EXPERTS_B // 2 + DENSE_B // 2 == 182_016
    coll = {c.kind: c for c in r0.collectives}
    # the experts are never gathered (efsdp 1): the root once, each block's dense part in forward and backward
    assert (coll["all-gather"].calls, coll["all-gather"].bytes_written) == (5, ROOT_B + 4 * BLOCK_DENSE_B) \
        == (5, 269_056)
    assert r0.breakdown["sharded parameters"] == EXPERTS_B // 2 + DENSE_B // 2 == 182_016
    # reduce-scatters: the root and the 2 blocks' dense gradients (the experts' over efsdp 1: none)
    assert (coll["reduce-scatter"].calls, coll["reduce-scatter"].bytes_read) == (3, DENSE_B)
    # all-to-all per MoE layer: the count exchange (4 int64: 32 B), the dispatch and the combine forward, their
    # two backward: 5 calls; even routing: 64 rows of 256 B out, 64 in, each = 16,384 B. Two layers:
    # 2 x (32 + 4 x 16,384) = 131,136 B read and written; through the link: half (the other rank's half)
    c = a2a(r0)
    assert (c.group, c.group_size, c.calls) == ("ep", 2, 10)
    assert c.bytes_read == c.bytes_written == 2 * (32 + 4 * 2 * TOKENS * ROW_B) == 131_136
    assert c.ring_bytes == 131_136 // 2
    notes = " ".join(str(n) for n in rep.notes)
    assert "expert parallel (ep 2)" in notes and "even: every expert receives the same number" in notes


def test_skewed_routing_worst_rank_by_hand():
    rep = simulate(gpus=4, ep=2, routing="skew:2")
    r0 = rep.plan.ranks[0]
    # ep 2 x efsdp 2: a rank holds 2 experts, half of each (FSDP over efsdp): 196,608 / 4; dense / 4
    assert r0.breakdown["sharded parameters"] == EXPERTS_B // 4 + DENSE_B // 4 == 91_008
    # the rank holding the hottest expert (routing_counts(32, 2, 4, 2, 2.0)): the dispatch sends 64 rows
    # (16,384 B) and receives 86 (22,016 B); the combine the reverse; backward likewise: per layer
    # 32 + 2 x (16,384 + 22,016) B each way, two layers
    c = a2a(r0)
    assert c.calls == 10 and c.bytes_read == c.bytes_written == 2 * (32 + 2 * (64 + 86) * ROW_B) == 153_664
    # through its link each call: the larger side less its own share, 43 of the 86 rows: 11,008 B (16 B of a
    # count exchange): 2 x (16 + 4 x 11,008) = 88,096
    assert c.ring_bytes == 2 * (16 + 4 * 43 * ROW_B) == 88_096
    notes = " ".join(str(n) for n in rep.notes)
    assert "skew:2: the hottest expert receives 2 times its even share" in notes and "worst rank" in notes


def test_ep_link_is_nvlink_within_a_node():
    # ep innermost on the sparse mesh: 8 consecutive ranks lie in one node of 8, 16 span two
    assert link_of(ParallelConfig(gpus=16, ep=8, gpus_per_node=8), "ep") == ("nvlink", 1)
    assert link_of(ParallelConfig(gpus=16, ep=16, gpus_per_node=8), "ep") == ("network", 8)


def test_bad_expert_parallel_configs_are_one_line():
    # no experts
    from transformers import LlamaConfig, LlamaForCausalLM
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2))
    with pytest.raises(InputError, match="needs a mixture-of-experts model: LlamaForCausalLM has no routed experts"):
        layerscope.parallel(llama, torch.randint(0, 128, (2, 16)), gpus=2, ep=2, device="cpu", backend="fake")
    # ep not dividing the 4 experts
    with pytest.raises(InputError, match=r"ep \(3\) must divide the number of experts: model.layers.0.mlp.experts has 4"):
        simulate(gpus=3, ep=3)
    # ep not dividing fsdp x cp x tp (the configuration's own check)
    with pytest.raises(InputError, match=r"ep \(4\) must divide fsdp x cp x tp"):
        ParallelConfig(gpus=2, ep=4)
    with pytest.raises(InputError, match="routing must be even or skew:F"):
        ParallelConfig(gpus=2, ep=2, routing="hot")
    # a skew no routing can have: 4 experts, top-2: an expert gets at most every token once, twice its share
    with pytest.raises(InputError, match="routing skew:3 cannot be"):
        simulate(gpus=2, ep=2, routing="skew:3")


def _moe(name):
    common = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2)
    torch.manual_seed(0)
    if name == "mixtral":
        return transformers.MixtralForCausalLM(transformers.MixtralConfig(**common, num_local_experts=4,
                                                                          num_experts_per_tok=2))
    if name == "gpt-oss":      # transposed expert weights with biases
        return transformers.GptOssForCausalLM(transformers.GptOssConfig(**common, num_local_experts=4,
                                                                        num_experts_per_tok=2, head_dim=16))
    # DeepSeek-V3: a shared expert beside the routed ones, group-limited routing (one group here)
    return transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(
        **common, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, first_k_dense_replace=0,
        n_group=1, topk_group=1, q_lora_rank=32, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8,
        v_head_dim=16))


@pytest.mark.parametrize("name", [pytest.param("gpt-oss", marks=pytest.mark.slow),   # fast-suite budget
                                  pytest.param("mixtral", marks=pytest.mark.slow),
                                  pytest.param("deepseek-v3", marks=pytest.mark.slow)])
def test_other_moe_architectures_dispatch_by_hand(name):
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    rep = layerscope.parallel(_moe(name), ids, gpus=2, ep=2, mixed_precision="off", device="cpu", backend="fake")
    # the same dispatch as Qwen3-MoE's (4 experts, top-2, hidden 64, 32 tokens a rank, 2 MoE layers): 131,136 B
    c = a2a(rep.plan.ranks[0])
    assert 2 * (32 + 4 * 2 * TOKENS * ROW_B) == 131_136
    assert (c.group, c.calls, c.bytes_read, c.bytes_written) == ("ep", 10, 131_136, 131_136)


@pytest.mark.slow        # fast-suite budget (make test under 5 min on 2 cores)
def test_all_to_all_priced_on_the_ep_link():
    from layerscope.costs.gpus import gpu
    from layerscope.planning.steptime.sharded_time import FRACTIONS
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    plan = layerscope.parallel(qwen3_moe(), ids, gpus=2, ep=2, gpu="H100", device="cuda", mixed_precision="off").plan
    # on the critical path (with tensor parallel's, tp_comm): 10 all-to-alls over NVLink (2 ranks in a node),
    # each what crosses the link (half of 16,384 B for the 8 of tokens, of 32 B for the 2 count exchanges) at
    # NVLink's bandwidth x the link fraction, plus one hop's latency
    h100, f = gpu("H100"), FRACTIONS
    want = (8 * 8_192 + 2 * 16) / (h100.nvlink * f["link"]) + 10 * f["nvlink_latency_s"]
    assert plan.timing["tp_comm"] == pytest.approx(want, rel=1e-9)


@pytest.mark.slow        # fast-suite budget (make test under 5 min on 2 cores)
def test_selective_op_checkpointing_saves_the_all_to_all():
    # torchtitan b5bcd76's save list holds _c10d_functional.all_to_all_single: the recompute of a checkpointed
    # block takes the dispatch and combine (and the count exchange) saved, communicating nothing more: the
    # 10 calls and 131,136 B of test_fsdp_x_ep_two_ranks_by_hand (full checkpointing: 16, 196,736 B)
    c = a2a(simulate(gpus=2, ep=2, ac="selective-op").plan.ranks[0])
    assert (c.calls, c.bytes_read) == (10, 131_136)
