"""The module tracker writes its hooks into nn.Module's hook dicts itself (issue 24: a RemovableHandle
per hook was most of the cost of hooking a deep model). What it writes must be what
register_forward_pre_hook(with_kwargs=True) and register_forward_hook(with_kwargs=True,
always_call=True) write, it must leave nothing behind, must not disturb the user's own hooks, and
a torch without those dicts must get the same records through the public methods."""

from __future__ import annotations

import torch
from torch import nn

import layerscope as ls
from layerscope import _compat
from layerscope._compat.apis import _HOOK_DICTS
from layerscope.capture.tracker import ModuleTracker


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 2)))


def _entries(m: nn.Module, key) -> list[bool]:
    return [key in getattr(m, name) for name in _HOOK_DICTS]


def test_direct_hooks_match_the_public_ones_and_go_away():
    model = _model()
    tracker = ModuleTracker()
    tracker.install(list(model.named_modules()))
    public = ModuleTracker()
    handles = []
    for m in model.modules():
        handles.append(nn.Module.register_forward_pre_hook(m, public._pre, with_kwargs=True))
        handles.append(nn.Module.register_forward_hook(m, public._post, with_kwargs=True, always_call=True))
    try:
        for i, m in enumerate(model.modules()):
            assert _entries(m, tracker.hook_key) == [True] * 5
            assert _entries(m, handles[2 * i].id) == [True, True, False, False, False]      # the pre-hook's two
            assert _entries(m, handles[2 * i + 1].id) == [False, False, True, True, True]   # the hook's three
            assert list(m._forward_pre_hooks)[0] == tracker.hook_key   # installed first, runs first
        assert tracker.hook_key < 0   # never one of RemovableHandle's ids
        model(torch.randn(2, 4))
        assert [(c.module, c.depth, c.parent) for c in tracker.calls] == \
            [(c.module, c.depth, c.parent) for c in public.calls]
    finally:
        tracker.remove()
        for h in handles:
            h.remove()
    assert all(not getattr(m, name) for m in model.modules() for name in _HOOK_DICTS)


def test_user_hooks_survive_an_analysis():
    model = _model()
    seen = []
    h = model[0].register_forward_hook(lambda m, a, o: seen.append(o.shape))
    ls.analyze(model, torch.randn(2, 4))
    assert len(model[0]._forward_hooks) == 1 and seen == [torch.Size([2, 4])]
    h.remove()


def test_a_torch_without_the_hook_dicts_gives_the_same_records(monkeypatch):
    model, x = _model(), torch.randn(2, 4)
    direct = ls.analyze(model, x, backward=True)
    what, since, _ = _compat._API["module_hook_dicts"]

    def gone():
        raise AttributeError("absent")
    monkeypatch.setitem(_compat._API, "module_hook_dicts", (what, since, gone))
    _compat.forget()
    try:
        assert _compat.get("module_hook_dicts") is None
        public = ls.analyze(model, x, backward=True)
        assert public.layers == direct.layers and public.trace.ops == direct.trace.ops
        assert all(not getattr(m, name) for m in model.modules() for name in _HOOK_DICTS)
    finally:
        monkeypatch.undo()
        _compat.forget()
