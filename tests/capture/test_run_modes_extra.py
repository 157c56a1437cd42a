"""Issue 18 follow-ups (from the `count` branch): a scripted child's layer owns its subtree's
parameters (per-layer params add up to the total); a non-leaf input that requires grad is
differentiated as a detached leaf (the caller's graph is not run backward, freed, or given .grad);
activations() draws from a private generator (another thread's random stream is not rewound)."""

from __future__ import annotations

import threading
import time
import warnings

import pytest
import torch
from torch import nn

import layerscope as ls
from tests.helpers import assert_sums, assert_unchanged, snapshot


def _model():
    # scripted Sequential(Linear(4, 3), ReLU, Linear(3, 2)) then an eager Linear(2, 2), on [5, 4]:
    # MACs 5*4*3 = 60, 5*3*2 = 30 (scripted: 90), 5*2*2 = 20 -> 110
    # params 4*3+3 = 15, 3*2+2 = 8 (scripted: 23), 2*2+2 = 6 -> 29
    torch.manual_seed(0)
    with warnings.catch_warnings():   # torch 2.13 deprecates jit.script; built on purpose here
        warnings.simplefilter("ignore", DeprecationWarning)
        scripted = torch.jit.script(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)))
    return nn.Sequential(scripted, nn.Linear(2, 2))


@pytest.mark.parametrize("device", [None, "meta"])
def test_scripted_child_owns_its_subtree_params(device):
    m = _model()
    x = torch.randn(5, 4, requires_grad=True)
    before = snapshot(m)
    rep = ls.analyze(m, x, device=device, backward=True)
    assert_unchanged(before, m)
    assert_sums(rep)                       # per-layer params add up (was 6 of 29)
    assert [(r.path, r.num_params, r.forward.macs) for r in rep.layers] == [
        ("", 0, 0), ("0", 23, 90), ("1", 6, 20)]
    assert rep.totals.macs == 110 and rep.totals.params == 29
    # backward: every Linear does grad input + grad weight, each as many MACs as its forward: 220
    assert rep.totals.backward.macs == 220


def test_scripted_child_profile_and_memory():
    m = _model()
    x = torch.randn(5, 4)
    mem = ls.memory(m, x)
    # parameters 29 floats = 116 bytes; their gradients the same
    assert mem.totals["parameter_bytes"] == 116 and mem.totals["gradient_bytes"] == 116
    lat = ls.profile(m, x, warmup=0, repeats=2)
    assert [r.path for r in lat.layers] == ["", "0", "1"]


def test_non_leaf_input_backward_stays_inside_the_model():
    # an input made by the caller's own graph (y = 2 * w). Conv2d(3, 8, 3) on [1, 3, 8, 8]: out
    # [1, 8, 6, 6] = 288 x 27 = 7,776 MACs; backward grad input 7,776 + grad weight 7,776 = 15,552,
    # and no op of the caller's graph (its aten.mul backward) recorded; w.grad stays None and the
    # caller's graph can still be run backward
    torch.manual_seed(0)
    m = nn.Conv2d(3, 8, 3)
    w = torch.randn(1, 3, 8, 8, requires_grad=True)
    y = 2 * w
    for device in (None, "meta"):
        rep = ls.analyze(m, y, backward=True, device=device)
        assert rep.totals.backward.macs == 15_552
        assert "aten.mul" not in [o.op for o in rep.trace.ops if o.phase == "backward"]
    assert w.grad is None
    y.sum().backward()
    assert torch.equal(w.grad, torch.full_like(w, 2.0))


class DropNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 4)

    def forward(self, x):
        return self.b(self.drop(self.a(x)))


def test_activations_leave_other_threads_random_stream():
    m = DropNet()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    done, draws = threading.Event(), []

    def user():
        while (not done.is_set() or len(draws) < 50) and len(draws) < 20_000:
            draws.append(torch.rand(16))
            time.sleep(0)

    torch.manual_seed(1234)
    u = threading.Thread(target=user)
    u.start()
    for _ in range(10):
        acts = ls.activations(m, x, mode="train")
    done.set()
    u.join(60)
    assert acts["b"].shape == (4, 4)
    ref = torch.Generator().manual_seed(1234)
    assert all(torch.equal(d, torch.rand(16, generator=ref)) for d in draws)


def test_activations_draw_what_a_real_forward_draws():
    m = DropNet().train()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    torch.manual_seed(7)
    real = m(x)
    torch.manual_seed(7)
    state = torch.get_rng_state()
    out = ls.activations(m, x, mode="train", select="")[""]
    assert torch.equal(out, real)
    assert torch.equal(torch.get_rng_state(), state)


def test_model_built_under_inference_mode():
    # A model built under inference mode holds inference tensors: leaving inference mode for the
    # run raised a raw "Inplace update to inference tensor outside InferenceMode" (restoring the
    # BatchNorm buffers). Conv2d(3, 8, 3) on [2, 3, 8, 8]: out [2, 8, 6, 6] = 576 x 27 = 15,552 MACs
    with torch.inference_mode():
        m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8))
        x = torch.randn(2, 3, 8, 8)
        mean = m[1].running_mean.clone()
    # train mode updates the BatchNorm buffers in place: only inside inference mode, as for the
    # model itself; eval mode runs in any grad mode
    for ctx, modes in ((torch.inference_mode, ("eval", "train")), (torch.no_grad, ("eval",)),
                       (torch.enable_grad, ("eval",))):
        with ctx():
            for mode in modes:
                rep = ls.analyze(m, x, mode=mode)
                assert rep.totals.macs == 15_552 and rep.coverage.complete
    assert torch.equal(m[1].running_mean, mean)
