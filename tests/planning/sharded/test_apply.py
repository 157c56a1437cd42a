"""parallel.apply on models on the meta device under torch's fake process group (one process, no
communication): what parallelize leaves on the parameters, against shapes derived by hand."""

import contextlib

import pytest
import torch
from torch import nn

transformers = pytest.importorskip("transformers")

from layerscope import _compat  # noqa: E402
from layerscope.errors import InputError  # noqa: E402
from layerscope.planning.config import ParallelConfig  # noqa: E402
from layerscope.planning.apply import build_mesh, data_parallel_rank, loss_context, parallelize
from layerscope.planning.blocks import canonical_tensors, find_blocks

# the brief's shrunk Llama: hidden 64, MLP 128, 4 heads of 16, 2 key/value heads, vocabulary 128
LLAMA = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, vocab_size=128)
GPT2 = dict(n_embd=64, n_layer=2, n_head=4, vocab_size=128, n_positions=32)


@contextlib.contextmanager
def fake_world(world: int, rank: int = 0):
    import torch.distributed as dist
    dist.init_process_group("fake", rank=rank, world_size=world, store=_compat.fake_store())
    try:
        yield
    finally:
        dist.destroy_process_group()   # the suite runs in one process: never leave a default group


def llama():
    with torch.device("meta"):
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))


def gpt2():
    with torch.device("meta"):
        return transformers.GPT2LMHeadModel(transformers.GPT2Config(**GPT2))


def parallel(model, world, **kw):
    config = ParallelConfig(gpus=world, **kw)
    return parallelize(model, config, build_mesh(config, "cpu")), config


def test_llama_fsdp_x_tp_placements():
    from torch.distributed.tensor import DTensor, Replicate, Shard
    with fake_world(4):
        model, _ = parallel(llama(), 4, tp=2)     # fsdp = 4 / 2 = 2: mesh (dp_shard 2, tp 2)
        q = model.model.layers[0].self_attn.q_proj.weight
        assert isinstance(q, DTensor) and q.device_mesh.mesh_dim_names == ("dp_shard", "tp")
        # colwise: q_proj [64 out, 64 in] split on rows by tp (64 / 2 = 32), FSDP2 then shards the
        # tp-local rows again by fsdp (32 / 2 = 16); torch names that dp placement a strided Shard(0)
        # (_StridedShard(0, split_factor=tp)), a Shard(0) of the tp shard
        assert tuple(q.shape) == (64, 64) and tuple(q.to_local().shape) == (16, 64)
        assert q.placements[1] == Shard(0) and q.placements[0].dim == 0
        # k_proj: 2 kv heads x 16 = 32 rows -> 32 / 2 / 2 = 8
        assert tuple(model.model.layers[0].self_attn.k_proj.weight.to_local().shape) == (8, 64)
        # rowwise o_proj [64, 64]: tp splits the input columns (Shard(1): 64 / 2 = 32), FSDP the rows (64 / 2)
        o = model.model.layers[0].self_attn.o_proj.weight
        assert o.placements == (Shard(0), Shard(1)) and tuple(o.to_local().shape) == (32, 32)
        # down_proj [64, 128]: rows 64 / 2, columns 128 / 2
        assert tuple(model.model.layers[1].mlp.down_proj.weight.to_local().shape) == (32, 64)
        # sequence-parallel norm: replicated on tp, FSDP shards its 64 elements by 2
        n = model.model.layers[0].input_layernorm.weight
        assert n.placements == (Shard(0), Replicate()) and tuple(n.to_local().shape) == (32,)
        # embedding rowwise on the vocabulary: 128 / 2 (tp) / 2 (fsdp) = 32 rows of 64
        assert tuple(model.model.embed_tokens.weight.to_local().shape) == (32, 64)
        # head colwise: [128, 64] rows 128 / 2 / 2
        assert tuple(model.lm_head.weight.to_local().shape) == (32, 64)


def test_llama_forward_on_fake_tensors_gives_vocab_sharded_logits():
    from torch.distributed.tensor import DTensor, Shard
    with fake_world(2):
        model, config = parallel(llama(), 2, tp=2, mixed_precision="off")
        model.to_empty(device="cpu")
        with _compat.new_fake_mode(allow_non_fake_inputs=True):
            ids = torch.zeros(2, 8, dtype=torch.long)
            logits = model(input_ids=ids, use_cache=False).logits
        # loss parallel: the head's output stays a DTensor sharded on the vocabulary (Shard(-1) = dim 2)
        assert isinstance(logits, DTensor) and logits.placements == (Shard(2),)
        assert tuple(logits.shape) == (2, 8, 128) and tuple(logits.to_local().shape) == (2, 8, 64)
        assert type(loss_context(config)).__name__ != "nullcontext"


def test_gpt2_fused_qkv_split_per_rank():
    from torch.distributed.tensor import Replicate, Shard
    with fake_world(2):
        model, _ = parallel(gpt2(), 2, tp=2)    # fsdp 1: TP only, mesh (tp 2)
        attn = model.transformer.h[0].attn
        # c_attn [64 in, 192 out] is split into q, k, v Conv1D [64, 64]; each colwise = Shard(1) on
        # Conv1D's [in, out] weight: 64 / 2 = 32 output columns per rank, its own q, k and v heads
        for part in (attn.c_attn.q, attn.c_attn.k, attn.c_attn.v):
            assert part.weight.placements == (Shard(1),) and tuple(part.weight.to_local().shape) == (64, 32)
            assert part.bias.placements == (Shard(0),) and tuple(part.bias.to_local().shape) == (32,)
        # the attention splits its local output in 3 of 64 / 2 = 32 columns: 2 heads of 16 per rank
        assert attn.split_size == 32 and attn.num_heads == 2
        # c_proj rowwise on Conv1D: Shard(0) of [64 in, 64 out], bias replicated
        assert attn.c_proj.weight.placements == (Shard(0),) and attn.c_proj.bias.placements == (Replicate(),)
        # GPT-2 ties wte and lm_head: both Shard(0) on the vocabulary, still one parameter
        assert model.lm_head.weight is model.transformer.wte.weight


def test_world_one_leaves_the_model_untouched():
    model = llama()
    before = {n: p for n, p in model.named_parameters()}
    modules = list(model.modules())
    out = parallelize(model, ParallelConfig(gpus=1, ac="full"), None)
    assert out is model and list(model.modules()) == modules
    assert {n: p for n, p in model.named_parameters()} == before   # the same parameter objects
    assert all(before[n] is p for n, p in model.named_parameters())


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.gate = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.proj(x) * self.gate(x)


class Toy(nn.Module):
    def __init__(self, n=4):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.blocks = nn.ModuleList(Block() for _ in range(n))
        self.heads = nn.ModuleList([nn.Linear(8, 2), nn.ReLU()])     # mixed classes: not the blocks

    def forward(self, x):
        x = self.inp(x)
        for b in self.blocks:
            x = b(x)
        return x


def test_find_blocks_takes_the_longest_same_class_list():
    assert [p for p, _ in find_blocks(Toy())] == ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]
    assert [p for p, _ in find_blocks(llama())] == ["model.layers.0", "model.layers.1"]
    with pytest.raises(InputError, match="no nn.ModuleList of repeated blocks"):
        find_blocks(nn.Sequential(nn.Linear(2, 2)))


def test_unknown_model_with_tp_is_one_line():
    with fake_world(2):
        with pytest.raises(InputError) as e:
            parallel(Toy(), 2, tp=2)
    msg = str(e.value)
    assert "\n" not in msg and "tensor parallel has no plan for blocks.0" in msg


def test_fsdp_and_selective_layer_ac_on_any_model():
    from torch.distributed.tensor import DTensor
    with fake_world(2):
        with torch.device("meta"):
            model = Toy()
        parallel(model, 2, ac="selective-layer:2")
        # torchtitan counts blocks from 1 and wraps every 2nd: blocks 1 and 3 (0-based)
        # (fully_shard then swaps each module's class for an FSDP subclass of it)
        wrapped = [hasattr(b, "_checkpoint_wrapped_module") for b in model.blocks]
        assert wrapped == [False, True, False, True]
        # FSDP on 2 ranks: Linear(8, 8)'s weight rows 8 / 2 = 4
        w = model.blocks[1]._checkpoint_wrapped_module.proj.weight
        assert isinstance(w, DTensor) and tuple(w.to_local().shape) == (4, 8)


def test_hsdp_mesh_and_data_parallel_rank():
    with fake_world(4, rank=3):
        config = ParallelConfig(gpus=4, replicate=2)           # fsdp = 4 / 2 = 2
        mesh = build_mesh(config, "cpu")
        assert mesh.mesh_dim_names == ("dp_replicate", "dp_shard")
        # rank 3 of a (2, 2) row-major mesh: coordinates (1, 1) -> data-parallel index 1 * 2 + 1
        assert data_parallel_rank(config, mesh) == 3
    with fake_world(2):
        mesh = build_mesh(ParallelConfig(gpus=2, replicate=2, fsdp=1), "cpu")
        assert mesh.mesh_dim_names == ("dp_replicate", "dp_shard") and tuple(mesh.shape) == (2, 1)


def test_canonical_tensors_fuses_qkv_and_drops_the_wrapper_prefix():
    q, k, v = torch.ones(4, 2), 2 * torch.ones(4, 2), 3 * torch.ones(4, 2)
    named = {"h.0._checkpoint_wrapped_module.attn.c_attn.q.weight": q,
             "h.0._checkpoint_wrapped_module.attn.c_attn.k.weight": k,
             "h.0._checkpoint_wrapped_module.attn.c_attn.v.weight": v, "wte.weight": torch.zeros(1)}
    out = canonical_tensors(named)
    assert set(out) == {"h.0.attn.c_attn.weight", "wte.weight"}
    # Conv1D's fused weight is [in, q|k|v]: the parts side by side on dim 1
    assert out["h.0.attn.c_attn.weight"].tolist() == [[1, 1, 2, 2, 3, 3]] * 4
