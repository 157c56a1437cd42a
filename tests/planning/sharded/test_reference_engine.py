"""The single process a real sharded run is compared with runs on capture's step engine (issue 59,
item 1): the same losses and first-step gradients, bit for bit, as the plain training loop it
replaced."""

from __future__ import annotations

import torch

from layerscope.examples import tiny_gpt
from layerscope.planning.real import sharded_run as sr


def _plain_loop(model, ids, labels, *, steps, optimizer, lr):
    sr.no_kv_cache(model)
    model.train()
    opt = sr._optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], lr)
    losses, grads = [], {}
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = sr.training_loss(model, ids, labels)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        losses.append(loss.item())
    return losses, grads


def test_reference_run_on_the_engine_equals_the_plain_loop():
    ids, labels = sr.make_batch(1000, 2, 16, 1)
    for opt in ("adamw", "sgd"):
        torch.manual_seed(0)
        plain = _plain_loop(tiny_gpt(), ids, labels, steps=3, optimizer=opt, lr=1e-3)
        torch.manual_seed(0)
        model = tiny_gpt()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        engine = sr.reference_run(model, ids, labels, steps=3, optimizer=opt, lr=1e-3)
        assert engine[0] == plain[0] and len(engine[0]) == 3
        assert engine[1].keys() == plain[1].keys() and all(torch.equal(engine[1][k], plain[1][k]) for k in plain[1])
        # the engine gives the model its weights back
        assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
