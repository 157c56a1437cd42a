"""The user's own training (or inference) loop, recorded step by step: the hooks that ``layerscope.Profiler``
puts on the model and its optimizer, where a step ends (``step_on``), each step's module call times
(capture/timing.py's Recorder), and meta copies of the first top-level call's inputs for the report's
costs. The Profiler holds one; it reports what this records."""

from __future__ import annotations

import contextlib

from . import hooks
from .counter import ForwardCounter
from .inputs import meta_copies
from .timing import CallTimes, Recorder

__all__ = ["LoopRecorder"]


class LoopRecorder:
    """The steps of the user's loop around ``model`` (see the module). ``steps``: per finished step that
    ran any module, (its calls' times, its wall seconds, its marks, its graph-hooking seconds);
    ``example``: (meta copies of the first top-level call's args, of its kwargs, training); ``counter``:
    the FLOPs and MACs of every forward as it ran (DeepSpeed's getters), or None."""

    def __init__(self, model, optimizer, device, step_on: str, count: bool) -> None:
        self.model, self.optimizer, self.step_on = model, optimizer, step_on
        self.rec = Recorder(model, device, backward=True)
        self.handles: list = []
        self.steps: list[tuple[list[CallTimes], float, list[tuple[str, float]], float]] = []
        self.example: tuple | None = None     # meta copies of the first top-level call's inputs
        # DeepSpeed's getters: the forwards that ran, counted as they ran (not a meta copy of one of them,
        # whose values are invented: a branch on them, a mask, a routing decision would be guessed)
        self.counter = ForwardCounter(model) if count else None
        self.running = False

    def start(self) -> None:
        """Put the hooks on and begin a step."""
        if self.running:
            return
        self._hook()
        self.rec.begin()
        self.running = True

    def stop(self) -> None:
        """End the current step (kept when it ran any module) and take every hook off."""
        if not self.running:
            return
        try:
            self._close_step()
        finally:
            self._unhook()
            self.running = False

    def next_step(self) -> None:
        """End the current step and begin the next."""
        if self.running:
            self._close_step()
            self.rec.begin()

    def forget(self) -> None:
        """Every recorded step, the example inputs and the counts forgotten."""
        self.steps = []
        self.example = None
        if self.counter is not None:
            self.counter.reset()

    @contextlib.contextmanager
    def paused(self):
        """Hooks off (the open step kept) while the profiler runs the model itself: the costs
        analysis of a report must not be recorded as calls of the user's step."""
        if not self.running:
            yield
            return
        self._unhook()
        try:
            yield
        finally:
            self._hook()

    def _hook(self) -> None:
        # first of the model's pre-hooks: a new step begins before the tracker numbers the call
        self.handles.append(hooks.forward_pre_hook(self.model, self._root_pre, prepend=True, with_kwargs=True))
        if self.optimizer is not None:
            self.handles += [self.optimizer.register_step_pre_hook(self._opt_pre),
                             self.optimizer.register_step_post_hook(self._opt_post)]
        self.rec.attach()
        if self.counter is not None:
            self.counter.attach()

    def _unhook(self) -> None:
        self.rec.detach()
        hooks.remove_all(self.handles)
        if self.counter is not None:
            self.counter.detach()

    def _root_pre(self, module, args, kwargs) -> None:
        if self.step_on == "forward" and self.rec.calls and self.rec.calls[0].f1 is not None:
            self.next_step()                   # no other marker: a step per top-level forward
        if self.example is None:
            self.example = (meta_copies(args), meta_copies(kwargs), module.training)

    def _opt_pre(self, opt, args, kwargs) -> None:
        self.rec.mark("optimizer")

    def _opt_post(self, opt, args, kwargs) -> None:
        self.rec.mark("/optimizer")
        if self.step_on == "optimizer":
            self.next_step()

    def _close_step(self) -> None:
        step = self.rec.end()
        if step[0]:
            self.steps.append(step)
