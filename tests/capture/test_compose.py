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
from layerscope.capture.blocks import find_run, truncated

from ..helpers import assert_unchanged, snapshot

tf = pytest.importorskip("transformers")


@pytest.fixture
def outcome(monkeypatch):
    """What the composition did in the calls that follow: passes widened, and why it gave up."""
    from layerscope.capture import composed as _composed
    seen = {"widened": 0, "refused": []}
    widen, attempt = compose_mod.Composer.widen, _composed.composed_steps

    def counted(self, *a, **k):
        widen(self, *a, **k)
        seen["widened"] += 1

    def attempted(*a, **k):
        try:
            return attempt(*a, **k)
        except Exception as e:
            seen["refused"].append(str(e))
            raise
    monkeypatch.setattr(compose_mod.Composer, "widen", counted)
    monkeypatch.setattr(_composed, "composed_steps", attempted)
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
                         num_attention_heads=4, num_key_value_heads=2, **{"use_cache": False, **extra})
    torch.manual_seed(0)
    return tf.LlamaForCausalLM(cfg)


IDS = {"input_ids": torch.zeros(2, 16, dtype=torch.long)}


@pytest.mark.parametrize("opts", [
    # 2 steps: optimizer state from the first on
    pytest.param(dict(optimizer="adamw"), marks=pytest.mark.slow),
    dict(training=False),                                      # an inference forward
    # 512-byte blocks, foreach, cuBLAS workspaces
    pytest.param(dict(optimizer="adamw", device="cuda", autocast_dtype="bf16"), marks=pytest.mark.slow),
    # gradients accumulated over two passes
    pytest.param(dict(optimizer="sgd", accumulation=2, keep_output=False), marks=pytest.mark.slow),
], ids=["adamw", "inference", "cuda-bf16", "sgd-accumulation"])
def test_llama_composed_is_the_whole_models_report(opts, outcome):
    model = llama()
    before = snapshot(model)
    same_reports(model, IDS, **opts)
    assert outcome["widened"] >= 1 and not outcome["refused"]
    assert_unchanged(before, model)     # the shorter model's copies and watched attributes leave no trace


@pytest.mark.slow
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


@pytest.mark.slow
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


class _Flagged(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x, flag=False):
        return self.lin(x) * 2 if flag else self.lin(x)


class _Stack(nn.Module):
    def __init__(self, blocks, rule=None):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        self.rule = rule

    def forward(self, x):
        kept = []
        for i, b in enumerate(self.blocks):
            if self.rule == "checkpoint at 5" and i == 5:
                x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False)
            elif self.rule == "flag at 5":
                x = b(x, flag=i == 5)
            else:
                x = b(x)
            if self.rule == "double at 5" and i == 5:
                x = x * 2
            if self.rule == "keep all":
                kept.append(x)
            if self.rule == "keep 5" and i == 5:
                held = x  # noqa: F841 - alive until the forward returns
        return torch.stack(kept).sum(0) if kept else x


def test_an_index_read_inside_a_block_is_seen(outcome):
    torch.manual_seed(0)
    same_reports(_Stack([_Branchy(i) for i in range(8)]), {"input_size": (4, 16)}, optimizer="adamw")
    assert outcome["widened"] == 0 and "'i'" in outcome["refused"][0]


@pytest.mark.parametrize("rule, why", [
    ("double at 5", "some places only"),           # an op of the loop's own at one place
    ("checkpoint at 5", "differently"),            # a block checkpointed at one place (saved-tensor hooks)
    ("flag at 5", "differently"),                  # a block called with another argument at one place
    ("keep 5", "longer"),                          # one place's output kept (no op shows it)
])
def test_the_loop_check_sees_a_place_the_loop_treats_apart(rule, why, outcome):
    # the five blocks that run see nothing at place 5: the record is consistent, only the loop check,
    # which runs the whole loop with stand-ins, sees what the loop does there
    torch.manual_seed(0)
    blocks = [_Flagged() for _ in range(10)] if rule == "flag at 5" else [nn.Linear(16, 16) for _ in range(10)]
    same_reports(_Stack(blocks, rule), {"input_size": (4, 16)}, optimizer="adamw")
    assert outcome["widened"] == 2 and why in outcome["refused"][0]


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


def test_a_block_registered_twice_is_not_a_block_of_the_run():
    torch.manual_seed(0)
    model = _Stack([nn.Linear(16, 16) for _ in range(8)])
    model.probe = model.blocks[4]          # the same module under a second name
    assert find_run(model) is None or find_run(model).count < 6
    same_reports(model, {"input_size": (4, 16)}, optimizer="adamw")


@pytest.mark.slow
def test_hooks_transformers_installs_on_a_first_call_are_not_left_by_the_shorter_model(outcome):
    # the first call with output_hidden_states installs transformers' capturing hooks on the blocks and
    # flags the root; the shorter model's run (refused: the hidden states are kept) must leave neither
    model = llama()
    inputs = {**IDS, "output_hidden_states": True}
    composed = ls.memory(model, **inputs, optimizer="adamw")
    assert outcome["refused"]
    assert composed.to_json() == ls.memory(llama(), compose=False, **inputs, optimizer="adamw").to_json()
    assert all(len(b._forward_hooks) <= 1 for b in model.model.layers)
    with torch.no_grad():
        out = model(**inputs)
    assert len(out.hidden_states) == model.config.num_hidden_layers + 1


class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return x + self.b(torch.nn.functional.gelu(self.a(x)))


def _per_block_groups(ps):            # layer-wise lr: one group per block (4 tensors), then the rest
    rest = ps[:-2]
    return torch.optim.AdamW([{"params": rest[i:i + 4], "lr": 0.9 ** i} for i in range(0, len(rest), 4)]
                             + [{"params": ps[-2:]}], foreach=True)


def _by_position(ps):                 # momentum for the first 16 tensors only
    return torch.optim.SGD([{"params": ps[:16], "momentum": 0.9}, {"params": ps[16:], "momentum": 0.0}], lr=0.1)


@pytest.mark.parametrize("optimizer, composes", [
    ("adagrad", True),                # state made when the optimizer is built
    (_per_block_groups, False),       # a group of the left-out blocks alone: refused
    (_by_position, False),            # groups by position: the middle blocks stepped apart, refused
    (lambda ps: torch.optim.AdamW(ps, fused=True), True),
])
def test_optimizers_built_for_the_whole_model(optimizer, composes, outcome):
    torch.manual_seed(0)
    model = _Stack([_Residual() for _ in range(8)])
    model.head = nn.Linear(16, 16)
    same_reports(model, {"input_size": (4, 16)}, optimizer=optimizer)
    assert (not outcome["refused"]) == composes


# ---- the KV cache on (transformers' default): each block writes its own slot, picked by its layer_idx ----

def test_blocks_writing_their_kv_cache_slots_compose(outcome):
    # use_cache=True, as users call the model: the attention reads self.layer_idx to pick the cache's slot
    # (capture/layer_index.py), every slot a DynamicLayer; the composed report is the whole model's
    model = llama(use_cache=True)
    before = snapshot(model)
    ids = IDS["input_ids"]
    same_reports(model, {"input_ids": ids, "labels": ids}, optimizer="adamw")
    assert outcome["widened"] >= 1 and not outcome["refused"]
    assert_unchanged(before, model)


@pytest.mark.slow
def test_gpt2_with_its_cache_composes_in_training_and_inference(outcome):
    cfg = tf.GPT2Config(n_layer=6, n_embd=64, n_head=4, vocab_size=128, n_positions=32)   # use_cache on
    torch.manual_seed(0)
    model = tf.GPT2LMHeadModel(cfg)
    assert cfg.use_cache
    same_reports(model, IDS, optimizer="adamw")
    same_reports(model, IDS, training=False)
    assert outcome["widened"] >= 2 and not outcome["refused"]


class _Indexed(nn.Module):
    """A block that uses its own layer index beyond a cache: by arithmetic, or through a config list."""

    def __init__(self, i, config=None):
        super().__init__()
        self.layer_idx = i
        self.config = config
        self.lin = nn.Linear(16, 16)

    def forward(self, x):
        if self.config is not None:          # indexing a list calls nothing Python sees: the list is checked
            return self.lin(x).relu() if self.config.layer_types[self.layer_idx] == "b" else self.lin(x)
        return self.lin(x).relu() if self.layer_idx % 4 == 3 else self.lin(x)


def test_a_layer_index_used_by_the_block_itself_is_seen(outcome):
    # place 3 (and 7) differ by arithmetic on the index; the five blocks run (0, 1, 2, 8, 9) all agree
    torch.manual_seed(0)
    same_reports(_Stack([_Indexed(i) for i in range(10)]), {"input_size": (4, 16)}, optimizer="adamw")
    assert outcome["widened"] == 0 and "'layer_idx'" in outcome["refused"][0] and "__mod__" in outcome["refused"][0]
    # the same through the config's per-layer list: only place 4 is of kind "b", never run by the five
    cfg = tf.PretrainedConfig(layer_types=["a"] * 4 + ["b"] + ["a"] * 5)
    torch.manual_seed(0)
    same_reports(_Stack([_Indexed(i, cfg) for i in range(10)]), {"input_size": (4, 16)}, optimizer="adamw")
    assert outcome["widened"] == 0 and "layer_types" in outcome["refused"][-1]
