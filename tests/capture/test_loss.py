"""The loss of a simulated training step (capture/loss.py), issue 58 item 0: a language model's step
was simulated with the sum of its logits as the loss, not the cross-entropy every training loop runs
(transformers' causal-LM loss and torchtitan's upcast the logits to fp32), and its memory was
under-predicted silently (Llama-3-8B, FSDP 8, local batch 2 x 8,192, selective-op: 49.5 GiB a rank
against 68.8 GiB with labels). By default the step now takes the model's own loss."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.errors import InputError

transformers = pytest.importorskip("transformers")

B, S, V, H = 2, 64, 8192, 32
L = B * S * V * 4            # bytes of the fp32 logits [B, S, V] (and of each tensor of their size below)
W_GRAD = V * H * 4           # bytes of lm_head's weight gradient


def _llama(device=None, layers: int = 1):
    cfg = transformers.LlamaConfig(num_hidden_layers=layers, hidden_size=H, intermediate_size=64, num_attention_heads=2,
                                   num_key_value_heads=2, vocab_size=V, max_position_embeddings=S)
    torch.manual_seed(0)
    with torch.device(device or "cpu"):
        return transformers.LlamaForCausalLM(cfg)


def _loss_note(rep) -> str:
    notes = [n for n in rep.notes if n.startswith("loss")]
    assert len(notes) == 1, rep.notes
    return notes[0]


def test_lm_step_takes_the_models_own_loss_as_given_labels_by_hand():
    # failed before: the default step summed the logits, 7.3 MB under the step given labels
    model = _llama()
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(0))
    kw = dict(optimizer=None, steps=1)
    default = ls.memory(model, input_ids=ids, **kw)
    by_hand = ls.memory(model, input_ids=ids, labels=ids, **kw)
    summed = ls.memory(model, input_ids=ids, loss="sum", **kw)
    assert default.peak_bytes == by_hand.peak_bytes
    assert default.peak_step.breakdown == by_hand.peak_step.breakdown
    assert "the model's own" in _loss_note(default) and "a copy of the token ids" in _loss_note(default)
    assert "the sum of the output" in _loss_note(summed)
    # By hand. The model's own loss (fp32 model: the upcast is a no-op) is log_softmax + nll_loss over the
    # [B*S, V] logits. Its peak is in log_softmax's backward, where four tensors of L bytes are alive: the
    # logits (the output, kept through the backward), their log-softmax (saved for the backward), the
    # log-softmax's gradient and the logits' gradient (two temporaries). The sum's peak is in lm_head's
    # backward: the logits, their gradient made whole (L) and lm_head's weight gradient (V x H fp32).
    # Everything else alive at the two peaks is the same (parameters, the block's saved activations), but
    # for tensors of [B, S, H] and smaller (the hidden state's gradient: 16 KiB; the labels: 1 KiB).
    d = default.peak_step.breakdown
    s = summed.peak_step.breakdown
    assert d["output"] - s["output"] in (0, 4)                       # the logits in both (+ the loss scalar)
    assert d["activation"] - s["activation"] == L                    # the saved log-softmax
    assert 2 * L <= d["temporary"] <= 2 * L + 64                     # the two gradients of L bytes
    assert abs((default.peak_bytes - summed.peak_bytes) - (2 * L - W_GRAD)) <= 32 * 1024


def test_lm_step_with_its_own_loss_matches_the_cpu_allocator():
    # the real step (transformers' own loss on the real labels) measured by the CPU allocator's events,
    # beside the simulated one: the same peak (23,549,688 B with AdamW here; 16,225,016 B with the sum)
    model = _llama()
    ids = torch.randint(0, V, (B, S), generator=torch.Generator().manual_seed(0))
    rep = ls.memory(model, input_ids=ids, optimizer="adamw", measure=True)
    assert rep.measured is not None and rep.measured.peak_bytes == rep.peak_bytes


def test_cross_entropy_matches_the_models_own_and_refuses_what_it_cannot_take():
    model = _llama("meta")
    ids = torch.empty(B, S, dtype=torch.long, device="meta")
    own = ls.memory(model, input_ids=ids, optimizer=None, steps=1)
    ce = ls.memory(model, input_ids=ids, optimizer=None, steps=1, loss="cross-entropy")
    # transformers' ForCausalLMLoss op for op: the same peak, but for the labels tensor the model's own
    # loss is given as an input (B x S int64)
    assert own.peak_bytes - ce.peak_bytes == B * S * 8
    assert "next-token cross-entropy" in _loss_note(ce)
    with pytest.raises(InputError, match="not both"):
        ls.memory(model, input_ids=ids, loss="sum", loss_fn=lambda out: out.logits.sum())
    with pytest.raises(InputError, match="loss must be"):
        ls.memory(model, input_ids=ids, loss="ce")
    mlp = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(InputError, match="takes none"):
        ls.memory(mlp, torch.randn(2, 4), loss="model")
    with pytest.raises(InputError, match="token ids"):
        ls.memory(mlp, torch.randn(2, 4), loss="cross-entropy")
    assert "no token ids" in _loss_note(ls.memory(mlp, torch.randn(2, 4)))

    def mse(out):
        """Mean square of the output."""
        return out.pow(2).mean()
    assert _loss_note(ls.memory(mlp, torch.randn(2, 4), loss_fn=mse)) == "loss: the given loss_fn (Mean square of the output)"


class _TinyLM(nn.Module):
    """A language model of its own (no transformers): token ids in, [B, S, vocab] logits out."""

    def __init__(self, vocab: int = 50, dim: int = 8) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(vocab, dim), nn.Linear(dim, vocab)

    def forward(self, ids):
        return self.head(self.emb(ids))


class _LabelsLM(_TinyLM):
    """Takes labels and reads them (a check a real loss makes): their values must be the real ones."""

    def get_output_embeddings(self):
        return self.head

    def forward(self, input_ids, labels=None):
        logits = self.head(self.emb(input_ids))
        if labels is None:
            return {"logits": logits}
        if bool((labels >= self.head.out_features).any()):
            raise ValueError("a label beyond the vocabulary")
        return {"loss": logits.float().logsumexp(-1).mean(), "logits": logits}


class _OtherLabels(_LabelsLM):
    """Takes labels of another kind (one per sample): the labels the step gives are refused."""

    def forward(self, input_ids, labels=None):
        if labels is not None and labels.dim() != 1:
            raise ValueError("labels are one class per sample")
        return self.head(self.emb(input_ids))


def test_auto_on_models_of_their_own():
    ids = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    lm = _TinyLM()
    auto = ls.memory(lm, ids)
    assert "next-token cross-entropy" in _loss_note(auto)
    assert auto.peak_bytes > ls.memory(lm, ids, loss="sum").peak_bytes
    # hidden states are no logits (their width is no vocabulary): the sum, said so
    enc = nn.Sequential(nn.Embedding(50, 8), nn.Linear(8, 12))
    assert "no language-model logits" in _loss_note(ls.memory(enc, ids))
    # the labels given to the forward are the ids, with their values: the check reads the real ones
    rep = ls.memory(_LabelsLM(), input_ids=ids)
    assert "the model's own" in _loss_note(rep)
    assert not any("no values" in n or "invent" in n for n in rep.notes), rep.notes
    # a forward that refuses the labels the step gave it: the error says so, and how to leave them out
    from layerscope.errors import ForwardError
    with pytest.raises(ForwardError, match="labels .*loss='cross-entropy' or 'sum' leaves them out"):
        ls.memory(_OtherLabels(), input_ids=ids)
    assert "next-token cross-entropy" in _loss_note(ls.memory(_OtherLabels(), input_ids=ids, loss="cross-entropy"))


def test_parallel_steps_take_the_same_loss():
    model = _llama("meta", layers=2)
    ids = torch.empty(4, S, dtype=torch.long, device="meta")
    kw = dict(device="cpu", mixed_precision="off")
    fsdp = ls.parallel(model, input_ids=ids, gpus=2, **kw)
    assert fsdp.plans[0].peak_bytes == ls.parallel(model, input_ids=ids, labels=ids, gpus=2, **kw).plans[0].peak_bytes
    assert "the model's own" in _loss_note(fsdp)
    # one device: memory()'s step, the same loss
    one = ls.parallel(model, input_ids=ids, gpus=1, **kw)
    mem = ls.memory(model, input_ids=ids, optimizer="adamw", device="cpu", keep_output=False)
    assert one.plans[0].peak_bytes == mem.peak_bytes
    assert _loss_note(mem) in one.notes


def test_pipeline_last_stage_takes_the_cross_entropy():
    # a pipeline's last stage takes no labels: the same fp32 cross-entropy, per micro-batch
    model = _llama("meta", layers=2)
    ids = torch.empty(4, S, dtype=torch.long, device="meta")
    kw = dict(device="cpu", mixed_precision="off", gpus=2, pp=2)
    pp = ls.parallel(model, input_ids=ids, **kw)
    assert "last pipeline stage" in _loss_note(pp)
    assert pp.plans[0].peak_bytes > ls.parallel(model, input_ids=ids, loss="sum", **kw).plans[0].peak_bytes


def test_max_batch_size_steps_take_the_models_own_loss():
    model = _llama("meta")
    ids = torch.empty(1, S, dtype=torch.long, device="meta")
    limit = ls.memory(model, input_ids=ids, batch_size=3, optimizer=None, steps=1).peak_bytes
    fit = ls.max_batch_size(model, input_ids=ids, limit=limit, optimizer=None, steps=1)
    assert fit.batch_size == 3
    assert "the model's own" in _loss_note(fit.report)
