"""Real third-party models built from transformers config classes (never downloaded)."""

from __future__ import annotations

import pytest
import torch

import layerscope as ls
from tests.helpers import assert_sums, assert_unchanged, snapshot

T = pytest.importorskip("transformers")


def _meta(cls, cfg):
    with torch.device("meta"):
        return cls(cfg)


def test_vit_b16_reference_macs():
    # ViT-B/16 at 224: 17.56 GMACs with the attention matmuls (torchinfo reports 0.17 G)
    m = _meta(T.ViTModel, T.ViTConfig())
    rep = ls.analyze(m, input_size=(1, 3, 224, 224))
    assert rep.totals.macs == pytest.approx(17.56e9, rel=1e-3)
    assert rep.coverage.complete
    assert_sums(rep)


def test_gpt2_small_params_tied_head_once():
    m = _meta(T.GPT2LMHeadModel, T.GPT2Config())
    rep = ls.analyze(m, torch.zeros(1, 128, dtype=torch.long, device="meta"))
    assert rep.totals.params == 124_439_808
    assert rep.totals.shared_params == 50257 * 768
    assert rep.coverage.complete
    assert_sums(rep)


def _small(cfg_cls, **kw):
    return cfg_cls(**kw)


CASES = {
    "gpt2": (T.GPT2LMHeadModel, lambda: T.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500,
                                                     n_positions=64, bos_token_id=0, eos_token_id=0), "ids"),
    "bert": (T.BertForMaskedLM, lambda: T.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                     intermediate_size=128, vocab_size=500), "ids"),
    "llama": (T.LlamaForCausalLM, lambda: T.LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                                                        num_key_value_heads=2, intermediate_size=128,
                                                        vocab_size=500), "ids"),
    "vit": (T.ViTForImageClassification, lambda: T.ViTConfig(num_hidden_layers=2, hidden_size=64,
                                                             num_attention_heads=4, intermediate_size=128,
                                                             image_size=32, patch_size=8), "pixels"),
    "resnet": (T.ResNetForImageClassification, lambda: T.ResNetConfig(embedding_size=16, hidden_sizes=[16, 32],
                                                                      depths=[1, 1]), "pixels224"),
}


def _inputs(kind, device="cpu"):
    g = torch.Generator().manual_seed(0)
    if kind == "ids":
        x = torch.randint(0, 500, (2, 16), generator=g)
    elif kind == "pixels":
        x = torch.randn(1, 3, 32, 32, generator=g)
    else:
        x = torch.randn(1, 3, 64, 64, generator=g)
    return x.to(device)


@pytest.mark.parametrize("name", list(CASES))
def test_small_models_cpu_meta_backward(name):
    cls, cfg, kind = CASES[name]
    torch.manual_seed(0)
    m = cls(cfg())
    x = _inputs(kind)
    before = snapshot(m)
    rep = ls.analyze(m, x)
    assert rep.coverage.complete, rep.coverage.uncounted
    assert rep.totals.macs > 0
    assert_sums(rep)
    assert_unchanged(before, m)
    # the same model on meta tensors: same MACs. SDPA on meta takes the math path (explicit bmm,
    # mask and softmax ops) where CPU runs the fused kernel, so FLOPs differ by the mask arithmetic.
    meta = ls.analyze(m, x, device="meta")
    assert meta.totals.macs == rep.totals.macs
    assert meta.totals.flops == pytest.approx(rep.totals.flops, rel=0.01)
    assert_unchanged(before, m)
    # a real backward, attributed to modules
    bwd = ls.analyze(m, x, backward=True, mode="train")
    assert bwd.totals.backward.macs > bwd.totals.forward.macs
    assert bwd.coverage.complete, bwd.coverage.uncounted
    assert_sums(bwd)
    assert_unchanged(before, m)


def test_gpt2_attention_counted_per_layer():
    # GPT-2 shrunk: n_embd 64, 4 heads, seq 16, batch 2. Per block:
    #   c_attn 32 rows * 64 * 192 = 393,216; attention 2*4 * 16*16 * (16 + 16) = 65,536;
    #   c_proj 32 * 64 * 64 = 131,072; mlp 32 * 64 * 256 * 2 = 1,048,576 -> 1,638,400
    cls, cfg, _ = CASES["gpt2"]
    m = cls(cfg())
    rep = ls.analyze(m, _inputs("ids"))
    blocks = [r for r in rep.layers if r.type == "GPT2Block"]
    assert len(blocks) == 2
    assert all(b.macs == 1_638_400 for b in blocks)
    # lm head (tied): 32 * 64 * 500 = 1,024,000
    assert rep.find("lm_head")[0].macs == 1_024_000
