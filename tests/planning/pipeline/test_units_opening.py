"""The split units ``_units`` finds with its incremental cut check (``_Opening``) against the same search
asking the whole-trace ``_Flow.check`` every time (the way it ran before, linear in the model per module
tried): the same units on every kind of model the suite splits, residual streams, encoder-decoders,
skip connections, tied weights and modules called twice among them."""

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.planning.split import opening as units_mod

transformers = pytest.importorskip("transformers")


class _Twice(nn.Module):
    """One module called twice (its records are closed: never opened) between two others."""

    def __init__(self):
        super().__init__()
        self.a, self.shared, self.b = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.b(self.shared(torch.relu(self.shared(self.a(x)))))


class _Skip(nn.Module):
    """A U-Net-like skip: the first block's output used again after two more, and a parameter-free piece."""

    def __init__(self):
        super().__init__()
        self.down, self.mid, self.up = nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU()), nn.Linear(16, 8)
        self.act = nn.Tanh()

    def forward(self, x):
        d = self.down(x)
        return self.act(self.up(torch.cat([self.mid(d), d], -1)))


def _mlp(n):
    return nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(n)])


def _cases():
    t = transformers
    ids = torch.randint(0, 100, (2, 8))
    yield "mlp", _mlp(40), (torch.randn(2, 16),)
    yield "twice", _Twice(), (torch.randn(2, 8),)
    yield "skip", _Skip(), (torch.randn(2, 8),)
    yield "gpt2", t.GPT2LMHeadModel(t.GPT2Config(n_layer=3, n_embd=32, n_head=4, vocab_size=100, n_positions=16)), \
        (ids,)
    yield "llama", t.LlamaForCausalLM(t.LlamaConfig(num_hidden_layers=3, hidden_size=32, num_attention_heads=4,
                                                    num_key_value_heads=2, intermediate_size=64,
                                                    vocab_size=100, use_cache=False)), (ids,)
    yield "t5", t.T5ForConditionalGeneration(t.T5Config(num_layers=2, num_decoder_layers=2, d_model=32, d_ff=64,
                                                        num_heads=4, d_kv=8, vocab_size=100)), \
        ((), {"input_ids": ids, "decoder_input_ids": ids})
    yield "bert", t.BertModel(t.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                                           intermediate_size=64, vocab_size=100)), (ids,)
    yield "resnet", t.ResNetForImageClassification(t.ResNetConfig(depths=[1, 1], hidden_sizes=[16, 32],
                                                                   embedding_size=8)), (torch.randn(2, 3, 32, 32),)


@pytest.mark.parametrize("name,model,inputs", list(_cases()), ids=[c[0] for c in _cases()])
def test_incremental_cut_check_finds_the_whole_check_units(name, model, inputs, monkeypatch):
    torch.manual_seed(0)
    args, kwargs = (inputs if isinstance(inputs[-1], dict) and len(inputs) == 2 else (inputs, {}))
    # a forward, and a training step's last pass (what partition() splits)
    traces = [ls.analyze(model.eval(), *args, **kwargs).trace,
              ls.memory(model.train(), *args, optimizer="adamw", steps=1, **kwargs).trace]
    flows = [units_mod._Flow(t) for t in traces]
    assert all(units_mod._Opening(f).ok for f in flows)    # sibling calls do not interleave: the fast path runs
    fast = [units_mod._units(f) for f in flows]
    monkeypatch.setattr(units_mod._Opening, "cuts", lambda self, units, i, pieces: None)
    assert fast == [units_mod._units(f) for f in flows]
    if name == "mlp":
        assert len(fast[0]) == 80              # every Linear and ReLU a unit of its own
