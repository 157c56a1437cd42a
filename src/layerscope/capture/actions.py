"""A pipeline rank's actions run as one pass of the step (capture/step.py): the forwards, losses and
backwards of its micro-batches in the order its schedule gives (plain (kind, key) data in a
PipelinePass, capture/spec.py), and its own actions beside them. Nothing here knows a schedule: the
kinds are autograd's (a forward, a backward, a zero-bubble backward split in the input's and the
weights'), and any other kind is the rank's own."""

from __future__ import annotations

from typing import Any

import torch

from ..errors import InputError
from ..trace import BACKWARD, FORWARD, LOSS
from .inputs import iter_tensors
from .records import ReleasedOutput, tensor_bytes
from .session import Session, run_backward, run_forward
from .spec import PipelinePass
from .storage import OUTPUT, StorageTracker

__all__ = ["run_actions", "mark_outputs"]


def mark_outputs(tracker: StorageTracker, output) -> None:
    """The output's storages play the OUTPUT role (a function of its own: a loop variable left in
    the pass's frame would hold the last output tensor, the logits, through the backward)."""
    for t in iter_tensors(output):
        tracker.mark(t, OUTPUT)


def run_actions(cap: Session, named, pipeline: PipelinePass, passes, saved_hooks, autocast, mark_phase):
    """A pipeline rank's actions (PipelinePass) in one pass: forwards keep their outputs and graphs
    alive until their backward (torch's PipelineStage keeps each micro-batch's output in its forward
    cache until then, the last stage's too, beside the loss), and the losses until the pass ends (the
    schedule's ``_internal_losses``). Returns what the pass remembers of the
    last forward's output: its bytes."""
    tracker = cap.storage
    call, backward, routed = passes
    modules = [m for _, m in named]
    held: dict[int, Any] = {}
    cache: dict[int, Any] = {}
    # torch's schedule keeps every micro-batch's loss until the step ends (``_internal_losses``)
    losses: list = []
    weights: set = set()      # micro-batches whose input's backward ran and weights' has not (zero bubble)
    last_bytes = 0
    backward_begun = False
    if pipeline.begin is not None:
        pipeline.begin()
    # one autocast region around the whole schedule step, as torchtitan steps a pipeline schedule under
    # its autocast: the cache of the weights' casts lives across the micro-batches (a cast made once)
    with autocast():
        for kind, m in pipeline.actions:
            if kind == "F":
                with saved_hooks:
                    mark_phase(FORWARD)
                    output = run_forward(cap, lambda: call(m))
                    if tracker is not None:
                        mark_outputs(tracker, output)
                    last_bytes = tensor_bytes(output)
                    if pipeline.loss is not None and (pipeline.takes_loss is None or pipeline.takes_loss(m)):
                        mark_phase(LOSS)
                        loss = pipeline.loss(m, output)
                        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                            raise InputError("loss_fn must return a scalar tensor")
                        held[m], cache[m] = loss, output
                        losses.append(loss)
                        del loss
                    else:
                        held[m] = output
                    del output
            elif kind == "B" or kind == "I" and pipeline.backward_input is not None:
                if m not in held:
                    raise InputError(f"the pipeline schedule runs the backward of micro-batch {m} before its forward")
                if tracker is not None:
                    # storages this pass's forwards made and that are still alive are held for a backward
                    tracker.backward_starts()
                backward_begun = True
                mark_phase(BACKWARD)
                h = held.pop(m)
                if kind == "B":
                    run_backward(cap, modules, lambda: pipeline.backward(m, h, backward))
                else:
                    run_backward(cap, modules, lambda: pipeline.backward_input(m, h, routed))
                    weights.add(m)
                del h
                cache.pop(m, None)
            elif kind == "W" and pipeline.backward_weight is not None:
                if m not in weights:
                    raise InputError(f"the pipeline schedule runs the weights' backward of micro-batch {m} before "
                                     "its input's")
                weights.discard(m)
                mark_phase(BACKWARD)
                run_backward(cap, modules, lambda: pipeline.backward_weight(m, routed))
            elif pipeline.act is not None:
                # the rank's own actions beside the compute (a stage's UNSHARD, RESHARD, REDUCE_GRAD)
                if backward_begun:
                    run_backward(cap, modules, lambda: pipeline.act(kind, m))
                else:
                    run_forward(cap, lambda: pipeline.act(kind, m))
            else:
                raise InputError(f"a pipeline action is 'F', 'B', 'I' or 'W', got {kind!r}")
    if held or weights:
        raise InputError(f"the pipeline schedule leaves micro-batches {sorted(held) or sorted(weights)} without "
                         + ("a backward" if held else "their weights' backward"))
    if pipeline.end is not None:
        if not backward_begun:
            mark_phase(BACKWARD)
        run_backward(cap, modules, pipeline.end)
    losses.clear()
    return ReleasedOutput(last_bytes)
