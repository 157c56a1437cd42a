"""Context parallel (issue 60 item 2): each cp rank's activations and the ring's rotating K/V buffers,
simulated (torch's ring on fake tensors, CUDA ranks: the SDPA router picks cuDNN on the H100), against a
hand derivation from the model's code and torch 2.13's ring (``_templated_ring_attention``,
``_SDPAMerger``, ``_AllGatherRotater``), for 2 and 4 ranks at two sequence lengths.

The model: a shrunk Llama (2 layers, hidden h 64, 4 heads and 2 KV heads of D 16, MLP I 128, vocabulary V
256, untied), one sample of S tokens; under FSDP's bf16 mixed precision (the default) over the cp ranks.
A rank holds s = S / cp tokens (head-tail chunks r and 2cp-1-r). The CUDA allocator rounds each block up
to 512 B (r512). What autograd holds when the backward starts (the activations part), from the code:

* rotary embedding: cos and sin cast to bf16, [1, s, D]: 2 x r512(32 s)
* per layer (x 2):
  - each RMSNorm (input, post-attention): its fp32 copy of the input r512(256 s), rsqrt [1, s, 1] fp32
    r512(4 s), the normalised bf16 r512(128 s) and the weight's product r512(128 s) (the projections' input)
  - attention: v_proj's output r512(64 s) (v), q and k after rotary: r512(128 s) and r512(64 s); the
    ring's outputs (the DTensor op's, saved for its backward): the merged output cast back to bf16
    [1, H, s, D] r512(128 s), the merged log-sum-exp [1, H, s] fp32 r512(16 s), and the last ring step's
    two small rest tensors (cuDNN's philox seed and offset) 2 x 512;
    plus, on a rank r < cp - 1 only, o_proj's contiguous copy of the output r512(128 s): a rank merges a
    later step's half (i > r: only the second half of q attends, ``partial``) with torch.cat, whose result
    is [B, H, s, D] in row order, so the transpose to [B, s, H, D] must copy; rank cp - 1 merges with
    elementwise ops only, which keep cuDNN's [B, s, H, D] layout, and its transpose is a view
  - MLP: gate_proj's output, its silu, up_proj's output and their product: 4 x r512(256 s)
* the final norm as above; the loss: log_softmax of the fp32 logits r512(4 V s), the labels padded by one
  (int64) r512(8 (s + 1)), nll's total weight 512.

The ring's rotating buffer (rotation ALL_GATHER, torch's default): each layer's forward and backward
all-gather cat(K, V) of the rank, 2 x Hkv x s x D bf16 (128 s bytes), into cp x that (the whole
sequence's K and V, 128 S bytes); the backward passes the fp32 K/V gradients (256 s bytes) round the ring
with cp all-to-alls a layer.
"""

import pytest
import torch

from layerscope.capture.attention import resolve_gpu, router_for
from layerscope.capture.loss import choose_loss
from layerscope.planning.config import ParallelConfig
from layerscope.planning.simulate.results import _live_parts
from layerscope.planning.simulate.world import WorldRun, simulate_world

transformers = pytest.importorskip("transformers")


def _r512(n: int) -> int:
    return -(-n // 512) * 512


def _llama():
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                   attn_implementation="sdpa", tie_word_embeddings=False)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg)


def _derived_activations(s: int, rank: int, cp: int) -> int:
    """The module docstring's derivation, term by term."""
    norm = _r512(256 * s) + _r512(4 * s) + 2 * _r512(128 * s)
    attention = _r512(64 * s) + _r512(128 * s) + _r512(64 * s) + _r512(128 * s) + _r512(16 * s) + 2 * 512
    copy = _r512(128 * s) if rank < cp - 1 else 0
    mlp = 4 * _r512(256 * s)
    layer = 2 * norm + attention + copy + mlp
    loss = _r512(4 * 256 * s) + _r512(8 * (s + 1)) + 512
    return 2 * _r512(32 * s) + 2 * layer + norm + loss


def _simulate(seq: int, cp: int):
    model = _llama()
    ids = torch.randint(0, 256, (1, seq))
    loss = choose_loss(model, (), {"input_ids": ids}, "auto")
    world = WorldRun(lambda ps: torch.optim.AdamW(ps), 1, loss, True, "nccl",
                     lambda: router_for(resolve_gpu("H100"), "auto", simulated=True, cuda_target=True))
    return simulate_world(model, (), {"input_ids": ids}, ParallelConfig(gpus=cp, cp=cp), world)


def _at_backward(rr) -> dict:
    """Each part's bytes just before the first backward op (the forward and the loss done)."""
    live, _ = _live_parts(rr)
    p = rr.run.passes[-1]
    t = next(p.offset + o.index for o in p.trace.ops if o.phase == "backward") - 1
    return {k: v[t] for k, v in live.items()}


def _ring_blocks(rr, op: str) -> list[int]:
    return sorted({b.nbytes for b in rr.tracker.blocks if b.op == op and b.alloc in rr.tracker.ring_ops})


def _check(seq: int, cp: int) -> None:
    ranks, first, groups, router, runs = _simulate(seq, cp)
    s = seq // cp
    assert sorted(runs) == list(range(cp))          # each place in the ring is its own role
    for r, rr in runs.items():
        assert _at_backward(rr)["activations"] == _derived_activations(s, r, cp), (seq, cp, r)
        # the rotating buffer: the whole sequence's K and V, bf16; the gradients' sends: the rank's, fp32
        assert _ring_blocks(rr, "_c10d_functional.all_gather_into_tensor") == [_r512(128 * seq)]
        assert _ring_blocks(rr, "_c10d_functional.all_to_all_single") == [_r512(256 * s)]
        coll = {c.op: c for c in ranks[r].collectives}
        gather, a2a = coll["cp._c10d_functional.all_gather_into_tensor"], coll["cp._c10d_functional.all_to_all_single"]
        # 2 layers x (forward + backward) all-gathers; 2 layers x cp all-to-alls
        assert (gather.calls, gather.bytes_read, gather.bytes_written) == (4, 4 * 128 * s, 4 * 128 * seq)
        assert gather.ring_bytes == 4 * 128 * s * (cp - 1)
        assert (a2a.calls, a2a.bytes_read, a2a.ring_bytes) == (2 * cp, 2 * cp * 256 * s, 2 * cp * 256 * s)
        assert gather.group == a2a.group == "cp" and gather.group_size == cp
    assert router.picked == {"cudnn": 2}


def test_cp2_seq64_activations_and_ring_buffers():
    # s = 32: rank 0 221,696 B, rank 1 213,504 B (the derivation; the simulation the same)
    assert _derived_activations(32, 0, 2) == 221_696 and _derived_activations(32, 1, 2) == 213_504
    _check(64, 2)


@pytest.mark.slow
@pytest.mark.parametrize("seq,cp", [(128, 2), (64, 4), (128, 4)])
def test_cp_activations_and_ring_buffers(seq, cp):
    _check(seq, cp)
