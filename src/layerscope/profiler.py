"""Profiler: per-module latency of the user's own training (or inference) loop.

    prof = layerscope.Profiler(model, optimizer)
    with prof:                              # start_profile() ... stop_profile()
        for x, y in batches:
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()                # ends a step (or call prof.step() yourself)
            optimizer.zero_grad()
    prof.report().print(depth=2)            # generate_report(): medians over the steps
    prof.end_profile()                      # forget the steps

Every module call's forward and backward time is recorded per step, as ``profile()`` does (the
same hooks), and each step's wall time is split into forward, backward, optimizer and the rest
(loss, data loading, the user's own Python). ``step_on`` says where steps end: "optimizer" (after
``optimizer.step()``; the default when an optimizer is given), "forward" (at the next top-level
forward; the default without one) or "manual" (only at ``step()``, for gradient accumulation);
``step()`` ends a step in any case. The first ``warmup_steps`` are left out of the report when
more steps than that were recorded. Nothing accumulates across reports:
medians over steps do not grow with the number of steps or with reuse of the profiler, and
``end_profile()`` forgets everything.
"""

from __future__ import annotations

import torch
from torch import nn

from .analyses.latency import timing
from .capture.counter import ForwardCounter
from .capture.notes import Note
from .capture.records import param_totals
from .capture.timing import CallTimes, merge_steps
from .capture.user_loop import LoopRecorder
from .errors import InputError

__all__ = ["Profiler"]


class Profiler:
    """Per-module latency of the user's own loop (see the module's documentation). ``costs``: count
    the FLOPs and MACs of every forward as it runs (DeepSpeed's getters: capture.counter's
    ForwardCounter, as FlopsProfiler), and analyse the first step's inputs on meta copies for the
    report's FLOPs and bytes per call; ``roofline`` as in ``profile()``."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None, *,
                 warmup_steps: int = 1, step_on: str | None = None, costs: bool = True,
                 roofline=None) -> None:
        from .capture import model_device
        from .capture.prepare import check_model
        check_model(model)
        if warmup_steps < 0:
            raise InputError(f"warmup_steps must be >= 0, got {warmup_steps}")
        step_on = step_on or ("optimizer" if optimizer is not None else "forward")
        if step_on not in ("optimizer", "forward", "manual") or step_on == "optimizer" and optimizer is None:
            raise InputError(f"step_on must be 'optimizer' (with an optimizer), 'forward' or 'manual'; got "
                             f"{step_on!r}")
        self.step_on = step_on
        self.model, self.optimizer = model, optimizer
        self.warmup_steps, self.costs, self.roofline = warmup_steps, costs, roofline
        self.device = model_device(model)
        # the hooks on the user's loop and the steps they recorded (capture/user_loop.py)
        self._loop = LoopRecorder(model, optimizer, self.device, step_on, costs)

    @property
    def running(self) -> bool:
        return self._loop.running

    # the DeepSpeed-shaped API ----------------------------------------------------------------
    def start_profile(self) -> None:
        """Put the hooks on and begin a step."""
        self._loop.start()

    def stop_profile(self) -> None:
        """End the current step (kept when it ran any module) and take every hook off."""
        self._loop.stop()

    def step(self) -> None:
        """End the current step and begin the next."""
        self._loop.next_step()

    def generate_report(self):
        """A LatencyReport of the steps so far (medians over steps, after the warm-up steps)."""
        return self.report()

    def end_profile(self) -> None:
        """Stop and forget every recorded step."""
        self.stop_profile()
        self._loop.forget()

    # DeepSpeed FlopsProfiler's getters (render/deepspeed.py has its formats) -------------
    # As FlopsProfiler's: the MACs and FLOPs of every forward since start_profile (end_profile forgets
    # them), counted as each ran; the duration, the top-level forward's median over the recorded steps.
    def _latency(self):
        """The LatencyReport of the steps so far, or None; a step still open is closed first, so that
        DeepSpeed's ``start_profile(); model(x); get_total_duration()`` sees the forward it just ran."""
        was_running = self.running
        self.stop_profile()
        try:
            return self.report() if self._loop.steps else None
        finally:
            if was_running:
                self.start_profile()

    def get_total_flops(self, as_string: bool = False):
        """Forward FLOPs of every forward since start_profile, as each ran (layerscope's convention)."""
        from .render.deepspeed import number_to_string
        n = _counted(self).flops
        return number_to_string(n) if as_string else n

    def get_total_macs(self, as_string: bool = False):
        """Forward MACs of every forward since start_profile."""
        from .render.deepspeed import macs_to_string
        n = _counted(self).macs
        return macs_to_string(n) if as_string else n

    def get_total_params(self, as_string: bool = False):
        """The model's parameters, each tensor once."""
        from .render.deepspeed import params_to_string
        n = param_totals(self.model)[0]
        return params_to_string(n) if as_string else n

    def get_total_duration(self, as_string: bool = False):
        """Seconds: the top-level forward's time, median over the recorded steps (after warm-up)."""
        from .render.deepspeed import duration_to_string
        latency = self._latency()
        n = latency.totals["forward"] if latency is not None else 0.0
        return duration_to_string(n) if as_string else n

    def print_model_profile(self, profile_step: int = 1, module_depth: int = -1, top_modules: int = 1,
                            detailed: bool = True, output_file: str | None = None) -> None:
        """DeepSpeed's profile printout (summary, aggregated top modules per depth, and the model's
        repr with each module's params, MACs, latency and FLOPS), to stdout or ``output_file``, as
        FlopsProfiler prints it: the counts and the times of every forward since start_profile, added
        up (a FLOPS figure divides the FLOPs of those forwards by their time, not by one step's)."""
        from .render.deepspeed import ModuleProfile, to_output_file, model_profile_text
        c = _counted(self)
        prof = ModuleProfile(self.model, None, durations=c.seconds, own={k: tuple(v) for k, v in c.own.items()},
                             uncounted=c.uncounted)
        text = model_profile_text(prof, profile_step, module_depth, top_modules, detailed)
        with to_output_file(output_file) as f:
            f.write(text)

    def __enter__(self) -> "Profiler":
        self.start_profile()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_profile()

    @property
    def steps(self) -> int:
        return len(self._loop.steps)

    # the report ------------------------------------------------------------------------------
    def report(self, warmup_steps: int | None = None):
        from .reports.latency import LatencyReport
        from .reports.notes import worded
        from .reports.latency import latency_layers
        skip = self.warmup_steps if warmup_steps is None else warmup_steps
        recorded = self._loop.steps
        steps = recorded[skip:] if len(recorded) > skip else recorded
        if not steps:
            raise InputError("no step was recorded: run the model between start_profile() and "
                             "stop_profile() (or inside `with profiler:`)")
        notes = []
        if len(recorded) <= skip:
            notes.append(Note("profiler-warmup-included", {"recorded": len(recorded), "skip": skip}))
        if self._loop.counter is not None:
            notes.append(Note("profiler-counting-in-forward", {}))
        calls = merge_steps([s[0] for s in steps])
        costs = self._costs(notes)
        backward = any(any(c.backward) for c in calls)
        totals = _step_totals(calls, steps)
        if costs is not None:
            totals["flops"] = costs.totals.flops
        from .analyses.roofline import roofline_for
        from .capture.prepare import float_dtype
        return LatencyReport(
            model_name=type(self.model).__name__, device=str(self.device),
            options={"steps": len(steps), "warmup": len(recorded) - len(steps), "backward": backward,
                     "unit": "step", "optimizer": type(self.optimizer).__name__ if self.optimizer else None},
            layers=tuple(latency_layers(calls, costs, backward)), totals=totals, notes=worded(notes),
            roofline=roofline_for(self.roofline, self.device, float_dtype(self.model)))

    def _costs(self, notes: list):
        if not self.costs or self._loop.example is None:
            return None
        from .api import analyze
        from .errors import LayerscopeError
        args, kwargs, training = self._loop.example
        try:
            with self._loop.paused():
                return analyze(self.model, *args, device="meta", mode="train" if training else "eval",
                               forward_kwargs=kwargs)
        except LayerscopeError as e:
            notes.append(Note("profiler-no-costs", {"error": str(e)}))
            return None


def _counted(prof: Profiler) -> ForwardCounter:
    """The profiler's counts of the forwards that ran (DeepSpeed's getters); none with costs=False."""
    if prof._loop.counter is None:
        raise InputError("Profiler(costs=False) counts no FLOPs or MACs: the getters need costs=True")
    return prof._loop.counter


def _step_totals(calls: list[CallTimes], steps) -> dict[str, float]:
    """Medians over steps: the step's wall time, the top-level calls' forward and backward, the
    optimizer's step (between its marks) and the rest (loss, data, the loop's own code), of which
    ``graph_hooks`` is the profiler's own work of hooking each step's autograd graph."""
    roots = [i for i, c in enumerate(calls) if c.parent is None]
    rows = {"step": [], "forward": [], "backward": [], "optimizer": [], "other": [], "graph_hooks": []}
    for r, (_, seconds, marks, hooking) in enumerate(steps):
        f = sum(calls[i].forward[r] for i in roots)
        b = sum(calls[i].backward[r] for i in roots)
        opt, start = 0.0, None
        for name, t in marks:
            if name == "optimizer":
                start = t
            elif name == "/optimizer" and start is not None:
                opt, start = opt + t - start, None
        for k, v in (("step", seconds), ("forward", f), ("backward", b), ("optimizer", opt),
                     ("other", seconds - f - b - opt), ("graph_hooks", hooking)):
            rows[k].append(v)
    out: dict[str, float] = {"runs": len(steps)}
    for k, v in rows.items():
        out[k] = timing(v).median
    out["forward_instrumented"] = out["forward_self_sum"] = out["forward"]
    out["backward_instrumented"] = out["backward_self_sum"] = out["backward"]
    out["step_spread"] = timing(rows["step"]).spread
    return out
