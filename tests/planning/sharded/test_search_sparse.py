"""The search's expert and context dimensions (issue 60, item 4): routed experts found from structure
(planning/moe.py), the space's ep and cp degrees as derived, the exact figures of a candidate with them
(planning/search/sparse.py) against hand derivations and never above a simulated rank, and the gate that
lists a candidate parallelize refuses (planning/search/refusals.py) instead of simulating or dropping it.

The shrunk Qwen3-MoE every test uses (hidden 64, 2 layers, 4 heads of 16, 2 KV heads, 4 experts of 32,
top-2, vocabulary 128), by hand:
  attention q 64x64 + k 64x32 + v 64x32 + o 64x64 + q_norm 16 + k_norm 16 = 12,320
  router 4 x 64 = 256; experts 4 x (2 x 32 x 64 + 64 x 32) = 24,576; 2 norms of 64 = 128
  a layer 37,280; 2 layers 74,560; embeddings and head 2 x 128 x 64 = 16,384; final norm 64
  total 91,008 elements, of which routed experts 2 x 24,576 = 49,152 and dense 41,856."""

import pytest
import torch
from torch import nn

import layerscope
from layerscope.errors import InputError
from layerscope.planning.config import ParallelConfig
from layerscope.planning.moe import expert_numel, experts_per_token, find_experts, routed_experts
from layerscope.planning.search import refusals as refusals_mod
from layerscope.planning.search.candidates import space
from layerscope.planning.search.refusals import refusals
from layerscope.planning.search.sparse import (alltoall_bytes, ring_bytes, sparse_model, sparse_state_bytes,
                                               stage_split)

SEQ = 32


def _qwen3_moe(layers=2):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    cfg = Qwen3MoeConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
                         num_experts_per_tok=2, moe_intermediate_size=32, max_position_embeddings=64)
    with torch.device("meta"):
        return Qwen3MoeForCausalLM(cfg)


def _llama(layers=2):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    with torch.device("meta"):
        return LlamaForCausalLM(cfg)


class _ListMoE(nn.Module):
    """A hand-written MoE block: a Linear router to 3 experts held as a ModuleList of alike MLPs."""

    def __init__(self):
        super().__init__()
        self.router = nn.Linear(8, 3, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(8, 16), nn.Linear(16, 8)) for _ in range(3))


def test_routed_experts_are_found_from_structure():
    m = _qwen3_moe()
    groups = find_experts(m)
    assert [(g.path, g.router, g.experts, g.numel) for g in groups] == [
        (f"model.layers.{i}.mlp.experts", f"model.layers.{i}.mlp.gate.weight", 4, 24_576) for i in range(2)]
    assert routed_experts(m) == 4 and expert_numel(m) == 49_152 and experts_per_token(m) == 2
    assert sum(p.numel() for p in m.parameters()) == 91_008          # the docstring's count
    # a ModuleList of alike experts beside a router: 3 experts of 8x16+16 + 16x8+8 = 280 elements each
    lst = _ListMoE()
    assert [(g.path, g.experts, g.numel) for g in find_experts(lst)] == [("experts", 3, 840)]
    # look-alikes without a router are not experts: a Conv1d's 3-D weight, a list of blocks, a dense Llama
    conv = nn.Sequential(nn.Conv1d(4, 4, 3), nn.Conv1d(4, 4, 3))
    assert find_experts(conv) == [] and find_experts(_llama()) == [] and routed_experts(_llama()) is None


def test_space_enumerates_ep_and_cp_as_derived():
    # 8 GPUs, 2 blocks, global batch 8, 4 routed experts, a sequence of 8:
    # cp: 1 and each divisor of 8 / tp whose 2 x cp divides 8 (2, 4; not 8: 16 does not divide 8)
    # ep: each divisor of fsdp x cp x tp that divides 4 (the experts)
    cands = space(8, 2, 8, fixed={"pp": 1, "ac": "none", "reshard_after_forward": True}, experts=4, seq=8)
    got = {(c.tp, c.cp, c.fsdp, c.ep) for c in cands}
    want = set()
    for tp in (1, 2, 4, 8):
        for cp in (1, 2, 4):
            if (8 // tp) % cp:
                continue
            fsdp = 8 // (tp * cp)
            for ep in (1, 2, 4):
                if (fsdp * cp * tp) % ep == 0:
                    want.add((tp, cp, fsdp, ep))
    assert got == want and (1, 2, 4, 4) in got and all(c.cp < 8 for c in cands)
    assert all(c.efsdp * c.ep == c.fsdp * c.cp * c.tp for c in cands)
    # a dense model (no experts) and an input without a sequence: the space as before, ep and cp 1
    plain = space(8, 2, 8, fixed={"pp": 1})
    assert {(c.cp, c.ep) for c in plain} == {(1, 1)}
    assert [c for c in space(8, 2, 8, fixed={"pp": 1}, experts=4, seq=8) if c.cp == 1 and c.ep == 1] == plain
    # held degrees are not searched
    assert {(c.cp, c.ep) for c in space(8, 2, 8, fixed={"pp": 1, "cp": 2, "ep": 2}, experts=4, seq=8)} == {(2, 2)}


def test_exact_figures_by_hand():
    m = _qwen3_moe()
    facts = sparse_model(m, 2)
    assert (facts.moe_blocks, facts.hidden, facts.top_k, facts.experts, facts.attention) == (2, 64, 2, 4, (2, 16, 16))
    split = stage_split(m, 1)
    assert split == [(41_856, 49_152)]
    # fsdp 4, ep 2, resharded: every rank 91,008 / 4 elements in fp32 = 91,008 B (EP moves no parameter bytes)
    c = ParallelConfig(gpus=4, fsdp=4, ep=2, local_batch=1, global_batch=4)
    assert sparse_state_bytes(c, split) == 91_008
    assert sparse_state_bytes(c, split, ratio=2.0) == 3 * 91_008          # AdamW's two moments
    # tp 2 x fsdp 2, ep 2, not resharded: 91,008 / 4 x 4 B = 91,008; gathered in bf16: dense 41,856 / 2 x 2 B
    # = 41,856 and the rank's 2 experts (efsdp 2 x 2 / 2 = 2 > 1) 49,152 / 2 x 2 B = 49,152: 182,016 B
    c = ParallelConfig(gpus=4, tp=2, fsdp=2, ep=2, local_batch=2, global_batch=4, reshard_after_forward=False)
    assert sparse_state_bytes(c, split) == 182_016
    # all-to-all: T = 2 x 32 / (cp 1 x tp 2) = 32 tokens, k 2, H 64, bf16, (ep - 1) / ep = 1/2:
    # 4 x 32 x 2 x 64 x 2 B / 2 = 16,384 B a MoE block, 2 blocks = 32,768 B
    assert alltoall_bytes(c, facts, SEQ) == 32_768
    # ep 4 over fsdp 4: T = 32 tokens (mbs 1), 3/4 leave: 4 x 32 x 2 x 64 x 2 B x 3/4 = 24,576 B a block, x 2
    c4 = ParallelConfig(gpus=4, fsdp=4, ep=4, local_batch=1, global_batch=4)
    assert alltoall_bytes(c4, facts, SEQ) == 49_152
    # ring: cp 2 x tp 2, mbs 4: 2 (cp - 1) x 4 x 16 positions x 2 KV heads x (16 + 16) x 2 B / tp 2 = 8,192 B
    # a layer, 2 layers = 16,384 B
    r = ParallelConfig(gpus=4, tp=2, cp=2, local_batch=4, global_batch=4)
    assert ring_bytes(r, facts, SEQ) == 16_384 and alltoall_bytes(r, facts, SEQ) == 0
    assert ring_bytes(c, facts, SEQ) == 0


@pytest.mark.parametrize("make, reshard", [(_qwen3_moe, False),
                                           pytest.param(_llama, True, marks=pytest.mark.slow)])   # fast-suite budget
def test_state_bound_is_never_above_the_simulated_peak(make, reshard):
    """The exact state (planning/search/sparse.py) at ep 1 and cp 1, the degrees this build simulates: never
    above the simulated rank's peak less what the bound leaves out by design (cuBLAS's workspaces and the
    NCCL/gloo estimates, 128 MiB here: without them the comparison would pass on them alone), AdamW's ratio 2.
    The Llama's by hand: 98,624 elements / 2 ranks x 4 B x (1 + 2) = 591,744 B, not resharded + 98,624 x 2 B."""
    m = make()
    ids = torch.zeros((1, SEQ), dtype=torch.long, device="meta")
    rep = layerscope.parallel(m, ids, gpus=2, fsdp=2, gpu="H100", reshard_after_forward=reshard)
    c = ParallelConfig(gpus=2, fsdp=2, local_batch=1, global_batch=2, reshard_after_forward=reshard)
    bound = sparse_state_bytes(c, stage_split(m, 1), ratio=2.0)
    rank = rep.plan.ranks[0]
    left_out = sum(v for k, v in rank.breakdown.items() if k == "workspaces" or "estimate" in k)
    assert left_out >= 2 * 64 * 2**20
    if make is _llama:
        assert bound == 591_744 + (0 if reshard else 197_248)
    assert 0 < bound <= rank.peak_bytes - left_out


def _not_applied(monkeypatch):
    """parallelize as a build that applies neither context nor expert parallel yet answered the probe (its
    refusal line, planning/apply.py before issue 60 landed both): the gate's mechanics stay tested."""
    def refuse(model, config, mesh):
        for name, what in (("cp", "context"), ("ep", "expert")):
            if getattr(config, name) > 1:
                raise InputError(f"{what} parallel ({name} {getattr(config, name)}) is not applied yet: "
                                 f"leave {name} at 1")
        return model
    monkeypatch.setattr(refusals_mod, "parallelize", refuse)


def test_this_build_refuses_neither_dimension():
    probe = [ParallelConfig(gpus=4, fsdp=4, ep=2), ParallelConfig(gpus=4, fsdp=2, cp=2)]
    assert refusals(probe) == {}


@pytest.mark.slow        # fast-suite budget (make test under 5 min on 2 cores)
def test_refused_dimensions_are_listed_not_simulated(monkeypatch):
    """Where parallelize refuses a dimension (as it did context and expert parallel until they were applied):
    the search lists each such candidate as refused with that line and its exact figures, simulates none, and
    counts only the rest in its headline. The probe follows parallelize: where it applies a dimension, nothing
    is refused."""
    m = _qwen3_moe()
    ids = torch.zeros((1, SEQ), dtype=torch.long, device="meta")
    probe = [ParallelConfig(gpus=4, fsdp=4, ep=2), ParallelConfig(gpus=4, fsdp=2, cp=2)]
    _not_applied(monkeypatch)
    gated = refusals(probe)
    assert set(gated) == {"cp", "ep"} and all("not applied yet" in v for v in gated.values())
    rep = layerscope.parallel(m, ids, gpus=4, gpu="H100", search=True, pp=1, tp=1, ac="none",
                              reshard_after_forward=True, global_batch=4)
    rows = rep.search["candidates"]
    refused = [r for r in rows if r["status"] == "refused"]
    # tp 1 held: (cp, fsdp) in (1, 4), (2, 2), (4, 1); ep dividing fsdp x cp = 4 and the 4 experts: 1, 2, 4;
    # the local batch 4 / fsdp split every way: 1 (fsdp 4), 2 (fsdp 2), 3 (fsdp 1) splits; refused: all but
    # cp 1 x ep 1 = 2 x 1 + 3 x 2 + 3 x 3 = 17 of the 3 x 1 + 3 x 2 + 3 x 3 = 18... by hand:
    want = sum(len([e for e in (1, 2, 4) if (4 % e == 0)]) * splits for cp, splits in ((1, 1), (2, 2), (4, 3))) - 1
    assert len(refused) == want == 17
    assert {(r["config"]["cp"] > 1 or r["config"]["ep"] > 1) for r in refused} == {True}
    assert all("is not applied yet" in r["why"] and "parameter shards" in r["why"] for r in refused)
    one = next(r for r in refused if r["config"]["ep"] == 4 and r["config"]["cp"] == 1)
    assert "(ep 4)" in one["why"] and "all-to-alls send 48.00 KiB" in one["why"]      # 49,152 B, above
    assert sum(r["status"] != "refused" for r in rows) == 1
    text = str(rep)
    assert "proven best among all 1 configurations" in text and "Refused" in text
    # the capability follows parallelize: a build that applies both refuses nothing
    monkeypatch.setattr(refusals_mod, "parallelize", lambda model, config, mesh: model)
    assert refusals(probe) == {}


def test_everything_refused_is_one_line(monkeypatch):
    m = _qwen3_moe()
    ids = torch.zeros((1, SEQ), dtype=torch.long, device="meta")
    _not_applied(monkeypatch)
    with pytest.raises(InputError, match=r"no configuration of 2 GPUs .* expert parallel \(ep 2\) is not applied"):
        layerscope.parallel(m, ids, gpus=2, gpu="H100", search=True, ep=2, pp=1, tp=1, global_batch=2)


def _deepseek_v3(layers=6, experts=8, moe=32):
    """DeepSeek-V3 shrunk: its first 3 blocks dense (first_k_dense_replace), the rest routed experts, top-2."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM
    cfg = DeepseekV3Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=4, n_routed_experts=experts, num_experts_per_tok=2,
                           moe_intermediate_size=moe, first_k_dense_replace=3, q_lora_rank=32, kv_lora_rank=16,
                           qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_group=2, topk_group=1,
                           max_position_embeddings=64)
    with torch.device("meta"):
        return DeepseekV3ForCausalLM(cfg)


@pytest.mark.slow
def test_copies_past_an_unlike_head_match_the_whole_model(monkeypatch):
    """Regression (2026-11-29): the search extended DeepSeek-V3 from copies of 3 and 4 blocks, its 3 dense
    blocks and then 1 MoE block, so the difference it multiplied by the remaining blocks held the first MoE
    block's transient peak (its experts gathered): 6.4 TB a rank for the 671B on fsdp 512. Copies of 6 and 7
    blocks (the dense head and MoE blocks either side of where a rank peaks, in both) give the whole model's
    figures. Slow: four simulations of a 32-expert model, 2-3 min on 2 loaded cores. Here 32 experts of 64
    (32 x 3 x 64 x 64 x 2 B = 768 KiB gathered a MoE block) on 9 blocks."""
    from layerscope.planning.search import copies
    m = _deepseek_v3(9, experts=32, moe=64)
    assert copies.alike_from(m) == 3 and copies.copy_points(3) == (6, 7)
    assert copies.alike_from(_llama()) == 0 and copies.copy_points(0) == (3, 4)
    ids = torch.zeros((1, 16), dtype=torch.long, device="meta")
    held = dict(tp=1, pp=1, fsdp=2, cp=1, ep=1, ac="none", accumulation=1, reshard_after_forward=True)
    whole = layerscope.parallel(m, ids, gpus=2, gpu="H100", **{k: v for k, v in held.items() if k != "accumulation"})
    searched = layerscope.parallel(m, ids, gpus=2, gpu="H100", search=True, global_batch=2, **held)
    exact = whole.plan.peak_bytes
    # measured 2026-11-29: the whole model 160,671,744 B; copies of 6 and 7 blocks the same; the old copies
    # of 3 and 4 blocks 164,783,616 B (+2.6%: the first MoE block's transient multiplied by the blocks left)
    assert searched.plan.peak_bytes == exact
    assert [r.peak_bytes for r in searched.plan.ranks] == [r.peak_bytes for r in whole.plan.ranks]
    monkeypatch.setattr(copies, "copy_points", lambda head: (3, 4))      # the old copies: the dense head, + 1 MoE
    old = layerscope.parallel(m, ids, gpus=2, gpu="H100", search=True, global_batch=2, **held)
    assert old.plan.peak_bytes > exact * 1.02


def test_a_searched_expert_parallel_plan_states_its_routing():
    """The search's report shows the plan it chose with expert parallel as parallel() shows one configuration:
    its ep and the routing assumption its figures follow, in the Configuration line and a note."""
    m = _qwen3_moe()
    ids = torch.zeros((1, SEQ), dtype=torch.long, device="meta")
    rep = layerscope.parallel(m, ids, gpus=4, gpu="H100", search=True, pp=1, tp=1, cp=1, ep=2, ac="none",
                              global_batch=4, routing="skew:1.5")
    text = str(rep)
    assert "ep 2 (routing skew:1.5)" in text
    assert any(n.startswith("expert parallel (ep 2)") and "skew:1.5" in n for n in rep.notes)


def test_context_parallel_with_a_pipeline_is_refused_before_the_walk():
    """The simulation refuses context parallel beside a pipeline (planning/context_parallel.py): the search
    asks that check before its walk (space._gate, refusals.simulation_refuses) and lists each such candidate
    refused with its line and exact figures, never as a family's error; the rest are walked."""
    from layerscope.planning.search.space import _gate
    m = _llama()
    ids = torch.zeros((1, SEQ), dtype=torch.long, device="meta")
    cands = space(4, 2, 4, fixed=dict(tp=1, ac="full", reshard_after_forward=True), seq=SEQ)
    both = [c for c in cands if c.cp > 1 and c.pp > 1]
    assert both and len(both) < len(cands)
    keep, out = _gate(m, (ids,), {}, cands, 2, SEQ, 2**40)
    assert [c.config for c in out] == both and keep == [c for c in cands if not (c.cp > 1 and c.pp > 1)]
    assert {c.status for c in out} == {"refused"}
    assert all("with a pipeline" in c.why and "what is exact" in c.why for c in out)
