"""The run engine (issue 32, step 1): one module tracker that others use by composition, one
backward attribution, and every module hook registered in capture/."""

from __future__ import annotations

import ast
from pathlib import Path

import torch
from torch import nn

from layerscope.capture.backward import SeqOwners
from layerscope.capture.tracker import ModuleTracker

_SRC = Path(__file__).resolve().parents[2] / "src" / "layerscope"
_HOOKS = {"register_forward_hook", "register_forward_pre_hook", "register_full_backward_hook",
          "register_full_backward_pre_hook", "register_backward_hook", "register_prehook",
          "register_multi_grad_hook", "register_module_forward_hook", "register_module_forward_pre_hook",
          "register_module_full_backward_hook", "register_module_full_backward_pre_hook"}


def test_module_hooks_are_registered_only_in_capture():
    outside = []
    for path in _SRC.rglob("*.py"):
        rel = path.relative_to(_SRC).as_posix()
        if rel.startswith("capture/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in _HOOKS:
                outside.append(f"{rel}:{node.lineno} {node.attr}")
    assert outside == []


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Sequential(nn.Linear(4, 2)))


def test_callbacks_see_every_call_forward_and_backward():
    model = _model()
    tracker = ModuleTracker()
    assert tracker.track_backward()
    seen = []
    tracker.register_user_hooks(pre_fw=lambda c: seen.append(("pre", c.path, c.depth, c.parent)),
                                post_fw=lambda c, out: seen.append(("post", c.path, tuple(out.shape))),
                                pre_bw=lambda i: seen.append(("bw", tracker.calls[i].path)),
                                post_bw=lambda: seen.append(("end",)))
    tracker.install(list(model.named_modules()))
    try:
        model(torch.randn(3, 4)).sum().backward()
    finally:
        tracker.remove()
    forward = [s for s in seen if s[0] in ("pre", "post")]
    assert forward == [("pre", "", 0, None), ("pre", "0", 1, 0), ("post", "0", (3, 4)), ("pre", "1", 1, 0),
                       ("post", "1", (3, 4)), ("pre", "2", 1, 0), ("pre", "2.0", 2, 3), ("post", "2.0", (3, 2)),
                       ("post", "2", (3, 2)), ("post", "", (3, 2))]
    backward = [s[1] for s in seen if s[0] == "bw"]
    # each call's nodes run after those of the calls that consumed its output; the parameters'
    # gradient accumulations belong to the Linear that owns them
    assert backward[0] == "2.0" and set(backward) == {"2.0", "1", "0"}
    assert backward.index("1") > max(i for i, p in enumerate(backward) if p == "2.0")
    assert seen[-1] == ("end",) and seen.count(("end",)) == 1
    assert not tracker.node_handles and all(not m._forward_hooks for m in model.modules())


def test_a_call_the_factory_declines_is_not_numbered():
    model = _model()
    tracker = ModuleTracker(new_call=lambda m, path, *rest: None if path == "1" else
                            ModuleTracker().new_call(m, path, *rest))
    tracker.install(list(model.named_modules()))
    try:
        model(torch.randn(1, 4))
    finally:
        tracker.remove()
    assert [c.path for c in tracker.calls] == ["", "0", "2", "2.0"] and tracker.calls[2].parent == 0


def test_seq_owners_name_the_innermost_call_when_a_node_was_made():
    owners = SeqOwners()
    for seq, owner in ((10, None), (12, 0), (15, 1), (15, 0), (20, 0)):
        owners.note(seq, owner)
    assert [owners.owner(s) for s in (10, 11, 12, 14, 15, 19)] == [0, 0, 1, 1, 0, 0]
    assert owners.owner(25, "after") == "after" and owners.spans(19) and not owners.spans(20)
