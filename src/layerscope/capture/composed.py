"""A simulated step of a model with a run of identical blocks, from five of them: the shorter model's
step widened to the whole model's (capture/compose.py), then the loop check.

The loop check. compose.py sees the five blocks that ran; the code around them (the loop over the
list, and whatever it does at each place) ran five times, not ``n``. So the whole model's forward runs
once more with the five blocks at their places and a stand-in at each other place of the run
(blocks.loop_check_model: new tensors shaped as the repeated block's output, no ops of a block), and
the composed trace must show, outside the blocks, the same module calls (path, class, input and output
shapes) and the same ops in the same order, and at every place of the run the same input and output
shapes. A loop that does something at some place only (``if i == 5``, keeping the outputs of chosen
places, a block called with other arguments there) differs and the whole model is simulated. The
check runs the forward only (a backward follows the forward's graph), on the same fake tensors,
autocast and attention routing.
"""

from __future__ import annotations

import torch

from ..trace import FORWARD, Trace
from .blocks import Truncated, find_run, loop_check_model, truncated
from .compose import NotComposable
from .step import StepRun, run_steps
from .storage import StorageTracker

__all__ = ["composed_steps", "NotComposable"]


def composed_steps(model, args: tuple, kwargs: dict, *, check_router=None, **step_kw) -> StepRun | None:
    """``run_steps(model, args, kwargs, simulate=True, **step_kw)`` composed from five blocks, or None
    where the model has no run of identical blocks to compose. NotComposable: the composition cannot
    stand for the whole model's step (simulate it whole). ``check_router``: a fresh SdpaRouter like the
    step's, for the loop check."""
    blocks = find_run(model)
    if blocks is None:
        return None
    tr = truncated(model, blocks)
    run = run_steps(model, args, kwargs, simulate=True, compose=tr, **step_kw)
    _check_loop(tr, run, args, kwargs, check_router, step_kw)
    return run


def _zero_loss(_out):
    return torch.zeros((), requires_grad=True)


def _check_loop(tr: Truncated, run: StepRun, args, kwargs, router, step_kw) -> None:
    check = loop_check_model(tr)
    training = step_kw.get("training", True)
    kw = {k: step_kw[k] for k in ("device", "autocast_dtype", "probe_kernels", "foreach_default") if k in step_kw}
    seen = run_steps(check, args, kwargs, simulate=True, tracker=StorageTracker(), optimizer=None, training=training,
                     loss_fn=_zero_loss if training else None, steps=1, accumulation=1, attention=router, **kw)
    if tr.reads:
        raise NotComposable(f"the forward read {tr.reads[0]!r}, which differs between the blocks")
    if _outside(tr, run.passes[0].trace) != _outside(tr, seen.passes[0].trace):
        raise NotComposable("the code around the blocks does something at some places only")


def _outside(tr: Truncated, trace: Trace):
    """What the loop check compares (see the module's docstring)."""
    run = tr.run
    pre = run.path + "." if run.path else ""
    places = {f"{pre}{run.start + i}" for i in range(run.count)}

    def inside(path: str) -> bool:
        if not path.startswith(pre):
            return False
        head = path[len(pre):].partition(".")[0]
        return f"{pre}{head}" in places
    layers = trace.layers
    calls = tuple((r.path, r.type, r.inputs, r.outputs) if not inside(r.path) else (r.path, r.inputs, r.outputs)
                  for r in layers if not inside(r.path) or r.path in places)
    ops = tuple(o.op for o in trace.ops if o.phase == FORWARD and not inside(layers[o.layer].path))
    return calls, ops
