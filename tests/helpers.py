"""Shared test helpers: model snapshots and the invariants every analysed model must satisfy."""

from __future__ import annotations

import torch
from torch import nn

from layerscope.trace import Costs

HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
              "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs",
              "_state_dict_hooks", "_load_state_dict_pre_hooks")


class Fn(nn.Module):
    """A module whose forward is a function: costs of single ops, attributed to one layer."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def snapshot(model: nn.Module) -> dict:
    """Everything an analysis must leave exactly as it found it."""
    return {
        "state": {k: (v.detach().clone() if v.device.type != "meta" else v.shape, v.device, v.dtype)
                  for k, v in model.state_dict(keep_vars=True).items()},
        "ids": {k: id(v) for k, v in model.state_dict(keep_vars=True).items()},
        "training": [m.training for m in model.modules()],
        "requires_grad": [p.requires_grad for p in model.parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in model.parameters()],
        "hooks": [[len(getattr(m, h, {})) for h in HOOK_DICTS] for m in model.modules()],
        "rng": torch.get_rng_state().clone(),
    }


def assert_unchanged(before: dict, model: nn.Module) -> None:
    after = snapshot(model)
    assert before["ids"] == after["ids"], "parameters or buffers were replaced"
    for k, (v, dev, dt) in before["state"].items():
        v2, dev2, dt2 = after["state"][k]
        assert dev == dev2 and dt == dt2, f"{k} changed device/dtype"
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, v2), f"{k} changed value"
    assert before["training"] == after["training"], "train/eval flags changed"
    assert before["requires_grad"] == after["requires_grad"], "requires_grad changed"
    for g1, g2 in zip(before["grads"], after["grads"]):
        assert (g1 is None) == (g2 is None) and (g1 is None or torch.equal(g1, g2)), ".grad changed"
    assert before["hooks"] == after["hooks"], "hooks were left behind"
    assert torch.equal(before["rng"], after["rng"]), "global RNG state changed"


def assert_sums(rep) -> None:
    """Per-layer self costs add up to the totals; the root's subtree equals the totals; params too."""
    fwd, bwd = Costs(), Costs()
    for r in rep.layers:
        fwd = fwd + r.forward
        bwd = bwd + r.backward
    assert fwd == rep.totals.forward
    assert bwd == rep.totals.backward
    assert rep.layers[0].forward_total == rep.totals.forward
    assert rep.layers[0].backward_total == rep.totals.backward
    counted = sum(r.num_params for r in rep.layers)
    uncalled = set(rep.coverage.uncalled_modules)
    assert counted <= rep.totals.params
    if not uncalled:
        assert counted == rep.totals.params
    # every parent's subtree equals its self plus its children's subtrees
    for r in rep.layers:
        kids = Costs()
        for c in r.children:
            kids = kids + rep.layers[c].forward_total
        assert r.forward_total == r.forward + kids


def assert_memory_sums(rep) -> None:
    """Per-layer memory adds up: owned params/grads/optimizer state and saved activations sum to the
    totals and to the root's subtree; each step's breakdown sums to its peak, which the timeline
    shows at the peak op."""
    t = rep.totals
    layers = rep.layers
    assert sum(r.param_bytes for r in layers) == t["parameter_bytes"] == layers[0].param_total
    assert sum(r.grad_bytes for r in layers) == t["gradient_bytes"] == layers[0].grad_total
    assert sum(r.optimizer_bytes for r in layers) + t["optimizer_unowned_bytes"] == t["optimizer_bytes"]
    assert sum(r.optimizer_bytes for r in layers) == layers[0].optimizer_total
    assert sum(r.saved_bytes for r in layers) == t["saved_activation_bytes"] == layers[0].saved_total
    total = rep.timeline.total
    for s in rep.steps:
        assert sum(s.breakdown.values()) == s.peak_bytes == total[s.peak_op]
        assert s.peak_bytes == max(total[s.phases[0].first_op:s.phases[-1].last_op + 1])
