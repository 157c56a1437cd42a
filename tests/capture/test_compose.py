"""A step composed from five blocks (capture/blocks.py, compose.py, composed.py) against the whole model
simulated block by block: the same report, byte for byte, where the blocks are identical; the whole
model simulated where they are not, or where the loop around them treats some place apart."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.capture import compose as compose_mod
from layerscope.capture import composed as composed_mod
from layerscope.capture.blocks import find_run, truncated

from ..helpers import assert_unchanged, snapshot

tf = pytest.importorskip("transformers")


@pytest.fixture
def outcome(monkeypatch):
    """What the composition did in the calls that follow: passes widened, and why it gave up."""
    seen = {"widened": 0, "refused": []}
    widen, check = compose_mod.Composer.widen, composed_mod._check_loop

    def counted(self, *a, **k):
        widen(self, *a, **k)
        seen["widened"] += 1

    def checked(*a, **k):
        try:
            check(*a, **k)
        except compose_mod.NotComposable as e:
            seen["refused"].append(str(e))
            raise

    def refused(self, *a, **k):
        try:
            counted(self, *a, **k)
        except compose_mod.NotComposable as e:
            seen["refused"].append(str(e))
            raise
    monkeypatch.setattr(compose_mod.Composer, "widen", refused)
    monkeypatch.setattr(composed_mod, "_check_loop", checked)
    return seen


def same_reports(model, inputs: dict, **opts):
    """The report with compose on and off; both renderings compared whole."""
    whole = ls.memory(model, compose=False, **inputs, **opts)
    composed = ls.memory(model, **inputs, **opts)
    assert composed.to_json() == whole.to_json()
    assert str(composed) == str(whole) and composed.to_csv() == whole.to_csv()
    return composed


def llama(layers=7, **extra):
    cfg = tf.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, use_cache=False, **extra)
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(cfg)


IDS = {"input_ids": torch.zeros(2, 16, dtype=torch.long)}


@pytest.mark.parametrize("opts", [
    dict(optimizer="adamw"),                                   # 2 steps: optimizer state from the first on
    dict(training=False),                                      # an inference forward
    dict(optimizer="adamw", device="cuda", autocast="bfloat16"),  # 512-byte blocks, foreach, cuBLAS workspaces
    dict(optimizer="sgd", accumulation=2, keep_output=False),  # gradients accumulated over two passes
], ids=["adamw", "inference", "cuda-bf16", "sgd-accumulation"])
def test_llama_composed_is_the_whole_models_report(opts, outcome):
    model = llama()
    before = snapshot(model)
    same_reports(model, IDS, **opts)
    assert outcome["widened"] >= 1 and not outcome["refused"]
    assert_unchanged(before, model)     # the shorter model's copies and watched attributes leave no trace


def test_checkpointed_blocks_and_a_sliding_window_compose(outcome):
    model = llama(6)
    (getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable)()
    same_reports(model, IDS, optimizer="adamw")
    cfg = tf.MistralConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=8, use_cache=False)
    torch.manual_seed(0)
    same_reports(tf.MistralForCausalLM(cfg), IDS, optimizer="adamw")
    assert outcome["widened"] == 4 and not outcome["refused"]


def test_plain_blocks_compose():
    torch.manual_seed(0)
    mlp = nn.Sequential(*[nn.Sequential(nn.Linear(32, 32), nn.ReLU()) for _ in range(12)])
    rep = same_reports(mlp, {"input_size": (8, 32)}, optimizer="adamw")
    # 12 blocks of a 32x32 Linear: (32*32 + 32) * 4 bytes each
    assert rep.totals.parameter_bytes == 12 * (32 * 32 + 32) * 4


def test_blocks_that_differ_by_index_are_simulated_whole(outcome):
    # Gemma2's blocks alternate sliding and full attention: an attribute that differs and is read
    cfg = tf.Gemma2Config(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                          use_cache=False)
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        same_reports(tf.Gemma2ForCausalLM(cfg), IDS, optimizer="adamw")
    assert outcome["widened"] == 0 and "sliding_window" in outcome["refused"][0]


class _Branchy(nn.Module):
    def __init__(self, i):
        super().__init__()
        self.i = i
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        return self.lin(x).relu() if self.i % 2 else self.lin(x)


class _Stack(nn.Module):
    def __init__(self, blocks, rule=None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.rule = rule

    def forward(self, x):
        kept = []
        for i, b in enumerate(self.blocks):
            x = b(x)
            if self.rule == "double at 5" and i == 5:
                x = x * 2
            if self.rule == "keep all":
                kept.append(x)
        return torch.stack(kept).sum(0) if kept else x


def test_an_index_read_inside_a_block_is_seen(outcome):
    torch.manual_seed(0)
    same_reports(_Stack([_Branchy(i) for i in range(8)]), {"input_size": (4, 16)}, optimizer="adamw")
    assert outcome["widened"] == 0 and "'i'" in outcome["refused"][0]


def test_the_loop_check_sees_a_place_the_loop_treats_apart(outcome):
    # the five blocks that run see nothing at place 5: the record is consistent, only the loop check,
    # which runs the whole loop with stand-ins, sees the extra multiplication there
    torch.manual_seed(0)
    same_reports(_Stack([nn.Linear(16, 16) for _ in range(8)], "double at 5"), {"input_size": (4, 16)},
                 optimizer="adamw")
    assert outcome["widened"] == 2 and "some places only" in outcome["refused"][0]


def test_outputs_kept_from_every_block_are_seen(outcome):
    torch.manual_seed(0)
    same_reports(_Stack([nn.Linear(16, 16) for _ in range(8)], "keep all"), {"input_size": (4, 16)},
                 optimizer="adamw")
    assert outcome["widened"] == 0 and outcome["refused"]


def test_find_run_refuses_hooks_and_ties_and_names_what_differs():
    blocks = [_Branchy(i) for i in range(7)]
    run = find_run(_Stack(blocks))
    assert (run.path, run.start, run.count, run.differing) == ("blocks", 0, 7, (("", "i"),))
    h = blocks[3].register_forward_hook(lambda *a: None)
    run = find_run(_Stack(blocks))
    assert run is None            # 3 + 3 around a hooked block: no run of 6
    h.remove()
    tied = [nn.Linear(4, 4) for _ in range(7)]
    tied[6].weight = tied[0].weight
    assert find_run(_Stack(tied)) is None or find_run(_Stack(tied)).count < 7
    short = truncated(_Stack(blocks), find_run(_Stack(blocks)))
    assert [m.i for m in short.model.blocks] == [0, 1, 2, 5, 6]
    assert [short.full_path(f"blocks.{i}.lin") for i in range(5)] == \
        ["blocks.0.lin", "blocks.1.lin", "blocks.2.lin", "blocks.5.lin", "blocks.6.lin"]
    assert all("i" in b.__dict__ for b in blocks)       # the user's blocks keep their attributes
