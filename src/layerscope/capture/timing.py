"""Timed runs of a model: every module call's forward and backward seconds, step by step.

Forward: a module call's inclusive time runs from its forward pre-hook to its forward hook (the
module tracker's callbacks). Backward: each call's autograd nodes, as the tracker attributes them
(capture/backward.py): a node's time runs from its pre-hook to the next node's (or the end of the
backward pass), so a call's backward self time is the sum over its nodes and self times add up to
the root's backward exactly.

CPU clocks are ``time.perf_counter``; on CUDA the hooks record CUDA events (no synchronize inside a
hook, which would stall the kernel stream and inflate every layer) and the times are read after one
synchronize at the end of each repeat or step.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from .tracker import ModuleTracker, TrackedCall, tracked_modules

__all__ = ["CallTimes", "Clock", "Recorder", "merge_steps"]


@dataclass
class CallTimes:
    """One module call (in pre-order) with its seconds per repeat or step: inclusive forward and
    backward, and where its spans lie from the start of the repeat (for traces; None: no span)."""

    path: str
    type: str
    depth: int
    call_index: int
    parent: int | None
    children: list[int]
    forward: list[float] = field(default_factory=list)
    backward: list[float] = field(default_factory=list)
    forward_span: list[tuple[float, float] | None] = field(default_factory=list)
    backward_span: list[tuple[float, float] | None] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, int]:
        return self.path, self.call_index



class Clock:
    """Timestamps that can be read after the repeat: perf_counter on CPU, CUDA events on CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def stamp(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a




class _TimedCall(TrackedCall):
    __slots__ = ("f0", "f1")

    def __init__(self, module, path, depth, call_index, parent, type_=None) -> None:
        super().__init__(module, path, depth, call_index, parent, type_)
        self.f0 = self.f1 = None


def _timed_call(module, path, depth, call_index, parent, args, kwargs, type_=None) -> _TimedCall:
    return _TimedCall(module, path, depth, call_index, parent, type_)


class Recorder:
    """Times every module call of ``model``, step by step, through a ModuleTracker's callbacks:
    ``attach()``, then per step ``begin()`` ... ``end()`` (which returns that step's calls and
    times), then ``detach()``. With ``backward``, the backward of every graph a top-level call built
    is timed too, on whatever thread autograd runs it. Nothing is kept from one step to the next."""

    def __init__(self, model: nn.Module, device: torch.device, backward: bool, defer: bool = False,
                 this_thread_only: bool = False) -> None:
        self.clock = Clock(device)
        # every thread's calls: a training loop may run its steps on a thread of its own; profile()'s
        # own runs (``this_thread_only``) are the calling thread's: another thread calling the same
        # model (where it is timed itself, not a copy) adds none of its calls (issue 58)
        self.tracker = ModuleTracker(this_thread_only=this_thread_only, new_call=_timed_call)
        # without autograd sequence numbers (a torch that lacks them) backward passes are not timed;
        # ``defer``: the graph is hooked at hook_pending(), not in the root's forward hook
        self.backward = backward and self.tracker.track_backward(defer)
        self.tracker.register_user_hooks(pre_fw=self._entered, post_fw=self._exited, pre_bw=self._node,
                                         post_bw=self._pass_end)
        self.named = tracked_modules(list(model.named_modules()))   # each module once, by its first path
        self._begin_state()

    def _begin_state(self) -> None:
        self.tracker.reset()
        self.events: list[tuple[Any, int]] = []   # backward: (stamp, call), call -1 = a pass ended
        self.marks: list[tuple[str, Any]] = []
        self.t0 = self.clock.stamp()

    @property
    def calls(self) -> list[_TimedCall]:
        """This step's calls so far, in pre-order."""
        return self.tracker.calls

    def mark(self, name: str) -> None:
        """A named instant of this step (seconds from its start come back from ``end()``)."""
        self.marks.append((name, self.clock.stamp()))

    # the tracker's callbacks --------------------------------------------------------------------
    def _entered(self, c: _TimedCall) -> None:
        c.f0 = self.clock.stamp()

    def _exited(self, c: _TimedCall, output) -> None:
        c.f1 = self.clock.stamp()

    def _node(self, call: int) -> None:
        self.events.append((self.clock.stamp(), call))

    def _pass_end(self) -> None:
        self.events.append((self.clock.stamp(), -1))

    # control -------------------------------------------------------------------------------
    def hook_pending(self) -> None:
        """Hook the graphs of the finished top-level calls (``defer``: between forward and backward,
        outside both timings)."""
        self.tracker.hook_pending()

    def attach(self) -> None:
        self.tracker.install(self.named)

    def detach(self) -> None:
        self.tracker.remove()

    def begin(self) -> None:
        self._begin_state()

    def end(self) -> tuple[list[CallTimes], float, list[tuple[str, float]], float]:
        """This step's calls with their seconds (one entry per list), the step's length, its marks
        (seconds from its start) and the CPU seconds spent hooking graph nodes. Node hooks come off."""
        t_end = self.clock.stamp()
        self.clock.sync()
        self.tracker.drop_node_hooks()
        self.tracker.pending = []
        calls, ev, sec, t0 = self.calls, self.events, self.clock.seconds, self.t0
        marks = [(name, sec(t0, t)) for name, t in self.marks]
        out = [CallTimes(c.path, c.type, c.depth, c.call_index, c.parent, list(c.children)) for c in calls]
        for o, c in zip(out, calls):
            done = c.f1 is not None and c.f0 is not None
            o.forward.append(sec(c.f0, c.f1) if done else 0.0)
            o.forward_span.append((sec(t0, c.f0), sec(t0, c.f1)) if done else None)
        b_self = [0.0] * len(calls)
        span: list[list[float] | None] = [None] * len(calls)
        for k in range(len(ev) - 1):
            t, i = ev[k]
            if i < 0:
                continue
            d = sec(t, ev[k + 1][0])
            b_self[i] += d
            s = sec(t0, t)
            if span[i] is None:
                span[i] = [s, s + d]
            else:
                span[i][0], span[i][1] = min(span[i][0], s), max(span[i][1], s + d)
        incl = b_self[:]
        for i in range(len(calls) - 1, -1, -1):    # children follow their parent in pre-order
            for k in calls[i].children:
                incl[i] += incl[k]
                if span[k] is not None:
                    span[i] = list(span[k]) if span[i] is None else [min(span[i][0], span[k][0]),
                                                                     max(span[i][1], span[k][1])]
        for i, o in enumerate(out):
            o.backward.append(incl[i])
            o.backward_span.append(tuple(span[i]) if span[i] is not None else None)
        return out, sec(t0, t_end), marks, self.tracker.hook_seconds


def merge_steps(steps: list[list[CallTimes]]) -> list[CallTimes]:
    """One list of calls from several steps' (each with one entry per list): a call is known by its
    path and call index; one missing from a step gets zero time there (its parent's self time
    holds it). The result is in pre-order."""
    merged: dict[tuple[str, int], CallTimes] = {}
    order: list[tuple[str, int]] = []
    for r, step in enumerate(steps):
        for c in step:
            m = merged.get(c.key)
            if m is None:
                m = merged[c.key] = CallTimes(c.path, c.type, c.depth, c.call_index, None, [],
                                              [0.0] * r, [0.0] * r, [None] * r, [None] * r)
                m.parent = step[c.parent].key if c.parent is not None else None   # a key until the end
                order.append(c.key)
            m.forward += c.forward
            m.backward += c.backward
            m.forward_span += c.forward_span
            m.backward_span += c.backward_span
        for m in merged.values():                 # absent from this step
            if len(m.forward) == r:
                m.forward.append(0.0)
                m.backward.append(0.0)
                m.forward_span.append(None)
                m.backward_span.append(None)
    kids: dict[Any, list[tuple[str, int]]] = {}
    for k in order:
        kids.setdefault(merged[k].parent, []).append(k)
    out: list[CallTimes] = []

    def visit(k, parent: int | None) -> None:
        c = merged[k]
        c.parent = parent
        i = len(out)
        out.append(c)
        c.children = []
        if parent is not None:
            out[parent].children.append(i)
        for kk in kids.get(k, []):
            visit(kk, i)

    for k in kids.get(None, []):
        visit(k, None)
    return out
