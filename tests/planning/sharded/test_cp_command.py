"""Context parallel (issue 60 item 2) end to end and its refusals: `layerscope parallel MODEL --cp C` plans,
says what it assumed and prices the ring's sends; what torch's ring cannot run is one line."""

import json

import pytest
import torch
from torch import nn

import layerscope
from layerscope.cli import main
from layerscope.costs.gpus import gpu as gpu_row
from layerscope.errors import ForwardError, InputError
from layerscope.planning.config import ParallelConfig
from layerscope.planning.context_parallel import check_context_parallel

transformers = pytest.importorskip("transformers")

_SHRUNK = ["--set", "vocab_size=256", "--set", "hidden_size=64", "--set", "intermediate_size=128", "--set",
           "num_hidden_layers=2", "--set", "num_attention_heads=4", "--set", "num_key_value_heads=2"]


def _llama(attn="sdpa"):
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, attn_implementation=attn)
    return transformers.LlamaForCausalLM(cfg)


def _one_line(capsys, needle: str) -> None:
    cap = capsys.readouterr()
    assert cap.err.count("\n") == 1 and needle in cap.err, cap.err
    assert "Traceback" not in cap.err


@pytest.mark.slow      # about 10 s of CPU: two ranks simulated for two steps, behind the CLI
def test_cli_cp_end_to_end_prices_the_ring(capsys):
    # hf:LlamaConfig shrunk (LlamaModel: the summed output is the loss), one sample of 64 tokens, 4 H100s:
    # fsdp 2 x cp 2
    rc = main(["parallel", "hf:LlamaConfig", *_SHRUNK, "--input-ids", "1,64", "--gpus", "4", "--cp", "2",
               "--gpu", "H100", "--format", "json"])
    assert rc == 0
    d = json.loads(capsys.readouterr().out)
    plan = d["plans"][0]
    assert plan["fsdp"] == 2 and [r["coords"]["cp"] for r in plan["ranks"]] == [0, 1, 0, 1]
    notes = " ".join(n if isinstance(n, str) else json.dumps(n) for n in d["notes"])
    assert "context parallel 2" in notes and "head-tail" in notes and "no mask tensor" in notes
    # the ring's sends on the cp group (size 2, within a node: NVLink), by hand: a rank holds s = 32 tokens;
    # each of 2 layers all-gathers cat(K, V) of 2 KV heads x 32 x 16 x bf16 = 4,096 B in the forward and
    # again in the backward (4 all-gathers, 4,096 B through each rank: (n - 1) / n of the 8,192 gathered),
    # and passes the fp32 K/V gradients (8,192 B) to the next rank twice a layer (4 permutes); each
    # collective costs its bytes over NVLink at the link fraction 0.8 plus one hop of 3 us
    nv = gpu_row("H100").nvlink
    want = 4 * (4096 / (nv * 0.8) + 3e-6) + 4 * (8192 / (nv * 0.8) + 3e-6)
    assert plan["timing"]["cp_comm"] == pytest.approx(want, rel=1e-9)
    # FSDP shards over fsdp x cp = 4 ranks (torchtitan's fsdp dimension): LlamaModel's 90,432 parameters
    # (embedding 256 x 64; a layer: q, o 64 x 64, k, v 32 x 64, gate, up, down 128 x 64, two norms of 64;
    # the final norm) each cut in 4 on dim 0, each fp32 shard one allocator block rounded up to 512 B:
    # embedding 16,384 + 2 x (4,096 x 2 + 2,048 x 2 + 8,192 x 3 + 512 x 2) + 512 = 92,672 B a rank
    assert plan["ranks"][0]["breakdown"]["sharded parameters"] == 92_672
    coll = {c["op"]: c for c in plan["ranks"][0]["collectives"]}
    assert coll["c10d._allgather_base_"]["group_size"] == 4
    assert coll["cp._c10d_functional.all_gather_into_tensor"]["ring_bytes"] == 4 * 4096
    assert coll["cp._c10d_functional.all_to_all_single"]["ring_bytes"] == 4 * 8192


def test_cli_cp_sequence_not_divisible(capsys):
    # head-tail load balancing cuts 60 tokens into 2 x 4 = 8 chunks: refused before any simulation
    rc = main(["parallel", "hf:LlamaConfig", *_SHRUNK, "--input-ids", "1,60", "--gpus", "4", "--cp", "4",
               "--gpu", "H100"])
    assert rc != 0
    _one_line(capsys, "sequence length 60 is not a multiple of 8")


def test_cp_refusals_are_one_line():
    ids = torch.randint(0, 256, (1, 64))
    cfg = ParallelConfig(gpus=2, cp=2)
    with pytest.raises(InputError, match="attention is 'eager'.*attn_implementation='sdpa'"):
        check_context_parallel(_llama("eager"), (), {"input_ids": ids}, cfg)
    with pytest.raises(InputError, match="without a mask tensor"):
        check_context_parallel(_llama(), (), {"input_ids": ids, "attention_mask": torch.ones(1, 64)}, cfg)
    with pytest.raises(InputError, match="not CPU's: plan for CUDA ranks"):
        check_context_parallel(_llama(), (), {"input_ids": ids}, cfg, "cpu")
    with pytest.raises(InputError, match="with a pipeline"):
        check_context_parallel(_llama(), (), {"input_ids": ids}, ParallelConfig(gpus=4, cp=2, pp=2))
    with pytest.raises(InputError, match="not a multiple of 4"):
        check_context_parallel(_llama(), (), {"input_ids": ids[:, :30]}, cfg)
    # through parallel(): the same line, before a rank is simulated
    with pytest.raises(InputError, match="attention is 'eager'"):
        layerscope.parallel(_llama("eager"), input_ids=ids, gpus=2, cp=2, gpu="H100")
    with pytest.raises(InputError, match="not CPU's"):
        layerscope.parallel(_llama(), input_ids=ids, gpus=2, cp=2, device="cpu")


class _NoAttention(nn.Module):
    """Token ids -> logits through an MLP: no SDPA call, so a ring would have nothing to run."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(64, 32)
        self.layers = nn.ModuleList(nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(2))
        self.head = nn.Linear(32, 64)

    def forward(self, input_ids):
        h = self.emb(input_ids)
        for block in self.layers:
            h = block(h)
        return self.head(h)


def test_cp_model_without_sdpa_is_refused_after_its_forward():
    # nothing says beforehand that this model has no SDPA: the ring counts its calls, and none ran
    from torch.distributed.tensor import DTensor
    sdpa, handlers = torch.nn.functional.scaled_dot_product_attention, DTensor._op_dispatcher._custom_op_handlers
    with pytest.raises(InputError, match="ran no scaled_dot_product_attention"):
        layerscope.parallel(_NoAttention(), input_ids=torch.randint(0, 64, (1, 16)), gpus=2, cp=2, gpu="H100",
                            steps=1)
    # torch's process-wide CP switches are put back (the patched SDPA, DTensor's handlers)
    assert torch.nn.functional.scaled_dot_product_attention is sdpa
    assert DTensor._op_dispatcher._custom_op_handlers == handlers


def test_cp_real_run_is_refused():
    from layerscope.torchrun.parallel import _checked
    with pytest.raises(InputError, match="simulated, not run"):
        _checked(ParallelConfig(gpus=2, cp=2), (2, 64), 3, "adamw")


@pytest.mark.slow
def test_cp_with_tp_hsdp_and_checkpointing():
    # the ring's collectives are the cp group's, tensor parallel's the tp group's (the same functional ops)
    ids = torch.randint(0, 256, (1, 64))
    rep = layerscope.parallel(_llama(), input_ids=ids, gpus=8, replicate=2, tp=2, cp=2, gpu="H100", steps=1)
    coll = {c.op: c for c in rep.plan.ranks[0].collectives}
    # 2 layers: forward + backward all-gathers of K/V, cp = 2 gradient passes a layer
    assert (coll["cp._c10d_functional.all_gather_into_tensor"].calls,
            coll["cp._c10d_functional.all_to_all_single"].calls) == (4, 4)
    assert coll["cp._c10d_functional.all_gather_into_tensor"].group_size == 2
    assert coll["_c10d_functional.all_gather_into_tensor"].group == "tp"
    assert coll["c10d.allreduce_"].group == "replicate" and coll["c10d._allgather_base_"].group_size == 2
    assert "cp 2" in rep.plan.label
    # full checkpointing: each layer's ring forward runs again in the recompute: 2 x (2 + 1) all-gathers
    rep = layerscope.parallel(_llama(), input_ids=ids, gpus=4, cp=2, ac="full", gpu="H100", steps=1)
    coll = {c.op: c for c in rep.plan.ranks[0].collectives}
    assert coll["cp._c10d_functional.all_gather_into_tensor"].calls == 6
    assert coll["cp._c10d_functional.all_to_all_single"].calls == 4


def test_cp_math_kernel_is_one_line():
    # fp32 with grouped KV heads on the H100: flash takes 16-bit only and the efficient kernel no GQA, so the
    # router picks CPU's math kernel, which has no ring (torch's own run fails inside DTensor's dispatch too)
    # torch 2.14 routes this call to a fused kernel whose ring then fails on the grouped heads' shapes: still one
    # line, the layer and the shapes it got named (ForwardError), not a traceback
    ids = torch.randint(0, 256, (1, 32))
    with pytest.raises((InputError, ForwardError), match="took the math kernel.*compute in bf16|forward failed in layer "
                                         "'model.layers.0.self_attn'.*Attempting to broadcast"):
        layerscope.parallel(_llama(), input_ids=ids, gpus=2, cp=2, gpu="H100", steps=1, mixed_precision="off")
    assert type(torch.nn.functional.scaled_dot_product_attention).__name__ == "builtin_function_or_method"
