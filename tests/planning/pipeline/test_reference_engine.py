"""The single process a real pipeline run is compared with runs on capture's step engine (issue 59,
item 1), each accumulation pass on its own micro-batch (StepSpec.micro_inputs): the same losses and
first-step gradients, bit for bit, as the plain accumulation loop it replaced."""

from __future__ import annotations

import dataclasses

import torch

from layerscope.options import optimizer_factory
from layerscope.planning.config import PartitionOptions
from layerscope.planning.real.pipeline_run import pipeline_loss, reference_run
from layerscope.planning.split.runnable import flat_inputs, main_tensor
from layerscope.torchrun.setup import build_setup


def _plain_loop(setup, options):
    model, args, kwargs, _, _, plan, target = setup
    tensors, rebuild = flat_inputs(args, kwargs)
    m = options.microbatches
    chunks = list(zip(*[t.tensor_split(m) for t in tensors]))
    targets = target.tensor_split(m)
    opt = optimizer_factory(options.optimizer)([p for p in model.parameters() if p.requires_grad])
    losses, grads = [], {}
    for step in range(options.steps):
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for c, t in zip(chunks, targets):
            a, k = rebuild(c)
            loss = pipeline_loss(main_tensor(model(*a, **k)), t)
            (loss / m).backward()
            total += loss.item()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters(remove_duplicate=False)
                     if p.grad is not None}
        opt.step()
        losses.append(total / m)
    return losses, grads


def test_pipeline_reference_on_the_engine_equals_the_plain_loop():
    base = PartitionOptions(microbatches=2, optimizer="sgd", device="cpu", stages=2, batch_size=4,
                            steps=2, measure_working=False)
    for opt in ("sgd", "adamw"):
        options = dataclasses.replace(base, optimizer=opt)
        plain = _plain_loop(build_setup("layerscope.examples:small_cnn", options), options)
        losses, grads, plan = reference_run(build_setup("layerscope.examples:small_cnn", options), options)
        assert losses == plain[0] and len(losses) == 2 and plan.num_stages == 2
        assert grads.keys() == plain[1].keys() and all(torch.equal(grads[k], plain[1][k]) for k in grads)
