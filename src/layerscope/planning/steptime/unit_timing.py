"""Measured on the real device, per split unit: forward and backward seconds (the per-call times of
capture/timing.py) and working memory (allocation events between marks where each unit's forward
and backward begin, as the module tracker sees each unit's calls)."""

from __future__ import annotations

import contextlib
import statistics
import time

import torch
from torch.autograd.profiler import record_function
from torch.nn.parameter import is_lazy

from ...capture.hooks import forward_hook, remove_all
from ...capture.inputs import iter_tensors, map_tensors
from ...capture.measure import profile_events
from ...capture.repeats import time_calls
from ...capture.state import StateGuard, model_device
from ...capture.loss import default_loss
from ...capture.spec import StepSpec, StepWatch
from ...capture.step import run_steps
from ...capture.tracker import ModuleTracker, tracked_modules

__all__ = ["unit_latencies", "unit_weight_shares", "unit_work_bytes"]


def _hooked_steps(model: torch.nn.Module, units, args: tuple, kwargs: dict, fire,
                  steps: int, loss_fn=None, after_step=None) -> None:
    """Run ``steps`` forward + loss + backward passes (capture's step engine: no optimizer, the
    output let go once the loss is computed) calling ``fire(unit_index, path, phase, when)`` (phase
    "f" or "b", when "begin" or "end") as the module tracker sees each unit's calls: a forward begins
    and ends at the call's hooks, a backward begins before the first autograd node the tracker
    attributes to a call inside the unit (capture/backward.py: node pre-hooks, which leave the step's
    allocations as they are; full backward hooks would add their own nodes and buffers). Gradients
    start empty and the model is left as it was found (the engine's StateGuard), hooks removed even
    on error."""
    unit_of_path = {path: g for g, u in enumerate(units.units) for path in u.paths}
    tracker = ModuleTracker()
    tracker.track_backward()
    owner: dict[int, int | None] = {}      # call index -> its unit (the innermost unit module around it)

    def unit(c) -> int | None:
        g = owner.get(c.index, -1)
        if g == -1:
            g = unit_of_path.get(c.path)
            if g is None and c.parent is not None:
                g = unit(tracker.calls[c.parent])
            owner[c.index] = g
        return g

    def pre_fw(c) -> None:
        g = unit(c)
        if g is not None:
            fire(g, c.path, "f", "begin")

    def post_fw(c, output) -> None:
        g = unit(c)
        if g is not None:
            fire(g, c.path, "f", "end")

    def pre_bw(i: int) -> None:
        c = tracker.calls[i]
        g = unit(c)
        if g is not None:
            fire(g, c.path, "b", "begin")

    tracker.register_user_hooks(pre_fw=pre_fw, post_fw=post_fw, pre_bw=pre_bw)

    @contextlib.contextmanager
    def hooked(named):
        tracker.install(tracked_modules(named))
        try:
            yield
        finally:
            tracker.remove()

    def on_step(r: int, when: str) -> None:
        if when == "begin":
            tracker.reset()
            owner.clear()
        elif after_step is not None:
            after_step(r)

    # the model's own mode, as the unit latencies measure it (the engine's default is train for a step)
    spec = StepSpec(model, tuple(args), kwargs, loss_fn=loss_fn, steps=steps, keep_output=False,
                    simulate=False, device=model_device(model), module_mode=model.training)
    run_steps(spec, StepWatch(on_step=on_step, modules=hooked))


def unit_latencies(model: torch.nn.Module, units, args: tuple, kwargs: dict,
                   repeats: int = 5, loss_fn=None) -> dict[str, tuple[float, float]]:
    """Median (forward, backward) seconds per unit over ``repeats`` training passes (after one
    warm-up), from the profiler's per-call times (``capture.repeats.time_calls``): a unit's time is
    the inclusive time of every call of its modules. Backward time is that of the autograd nodes
    each module's forward made, so a first unit's weight gradients count for it. The loss's own
    forward and backward (timed alone on the model's output) go to the last unit: they run on the
    last stage."""

    def loss_of(out):
        for p in model.parameters():
            p.grad = None
        return (loss_fn or default_loss)(out)

    dev = model_device(model)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    guard = StateGuard(model, inputs=(args, kwargs))
    loss_f, loss_b = [], []
    try:
        calls, _, _ = time_calls(model, lambda: model(*args, **kwargs), loss_of, device=dev,
                                 warmup=1, repeats=repeats)
        with torch.no_grad():
            result = model(*args, **kwargs)
        for _ in range(repeats + 1):              # the first is a warm-up
            leaf = map_tensors(result, lambda t: t.detach().requires_grad_(t.is_floating_point()))
            sync()
            t0 = time.perf_counter()
            loss = (loss_fn or default_loss)(leaf)
            sync()
            t1 = time.perf_counter()
            if loss.requires_grad:
                loss.backward()
            sync()
            loss_f.append(t1 - t0)
            loss_b.append(time.perf_counter() - t1)
            del loss, leaf
        del result
    finally:
        guard.restore()
    out = {}
    for u in units.units:
        mine = [c for c in calls if c.path in u.paths]
        out[u.name] = (statistics.median(sum(c.forward[r] for c in mine) for r in range(repeats)),
                       statistics.median(sum(c.backward[r] for c in mine) for r in range(repeats)))
    if units.units:
        last = units.units[-1].name
        f, b = out[last]
        out[last] = (f + statistics.median(loss_f[1:]), b + statistics.median(loss_b[1:]))
    return out


def unit_weight_shares(model: torch.nn.Module, units, args: tuple, kwargs: dict,
                       repeats: int = 5, loss_fn=None) -> dict[str, float]:
    """Each unit's share of its backward that computes the weights' gradients (zero bubble's W), timed:
    the units' backward seconds (``time_calls``, as ``unit_latencies``) with the parameters as they are,
    then with every parameter frozen, where autograd computes the input gradients alone (what zero
    bubble's I runs); the share is 1 - frozen / whole, within [0, 1]. Frozen, a floating-point input
    of the model requires grad, so that the first unit's input gradient runs too; where there is none
    (token ids), the first unit's modules' outputs do, and its backward counts as weights' alone (an
    embedding's is). The loss's own backward, an input gradient, is in neither. The parameters'
    ``requires_grad`` is given back, also on error."""
    dev = model_device(model)
    trainable = [p for p in model.parameters() if p.requires_grad]

    def loss_of(out):
        for p in model.parameters():
            p.grad = None
        return (loss_fn or default_loss)(out)

    def backward_of(calls) -> dict[str, float]:
        return {u.name: statistics.median(sum(c.backward[r] for c in calls if c.path in u.paths)
                                          for r in range(repeats)) for u in units.units}

    def leaf(t):
        return t.detach().requires_grad_() if t.is_floating_point() else t

    guard = StateGuard(model, inputs=(args, kwargs))
    handles: list = []
    try:
        calls, _, _ = time_calls(model, lambda: model(*args, **kwargs), loss_of, device=dev, warmup=1,
                                 repeats=repeats)
        whole = backward_of(calls)
        for p in trainable:
            p.requires_grad_(False)
        a2, k2 = map_tensors((args, kwargs), leaf)
        if not any(t.is_floating_point() for t in iter_tensors((a2, k2))) and units.units:
            for path in units.units[0].paths:
                handles.append(forward_hook(model.get_submodule(path), lambda m, i, out: map_tensors(out, leaf)))
        calls, _, _ = time_calls(model, lambda: model(*a2, **k2), loss_of, device=dev, warmup=1, repeats=repeats)
        frozen = backward_of(calls)
    finally:
        remove_all(handles)
        for p in trainable:
            p.requires_grad_(True)
        guard.restore()
    # a unit without a gradient of its own has no W: 0, not what the noise between the two timings says
    return {name: min(1.0, max(0.0, 1.0 - frozen[name] / b)) if b > 0 and u.grad_bytes else 0.0
            for u, (name, b) in zip(units.units, whole.items())}


def unit_work_bytes(model: torch.nn.Module, units, args: tuple, kwargs: dict,
                    loss_fn=None) -> dict[str, int]:
    """Each unit's working memory measured on the real device: one training step (after a warm-up
    step, except on CPU: see below) runs under the profiler's allocation events, with a marker where each unit's forward and
    backward begin. A unit's forward spans from its first module's entry to the next unit's entry
    (the last unit: to its own exit); its backward from the first autograd node attributed to it to
    the previous unit's first (the first unit: to the end of the step), so a first layer's weight
    gradient counts for it. Working memory
    is as in the simulation: forward, the peak minus the live bytes at the span's end; backward, the
    peak minus the live bytes at its start. This sees what simulation on fake tensors cannot: the
    scratch buffers of the device's kernels (oneDNN reorders a convolution's gradient into an
    activation-sized buffer)."""
    device = model_device(model)
    marks: dict[tuple, bool] = {}

    def fire(g, path, phase, when):
        if when == "begin" and (g, phase) not in marks:   # the unit's first module to run
            marks[g, phase] = True
            with record_function(f"layerscope.unit.{g}.{phase}"):
                pass
        elif when == "end" and phase == "f" and path == units.units[-1].paths[-1]:
            with record_function("layerscope.unit.end.f"):
                pass

    def after_step(r):
        marks.clear()

    # A warm-up step where a first call allocates what later ones reuse: CUDA's cuBLAS / cuDNN
    # workspaces, and lazy modules' parameters. On CPU no first-call buffer shows among the
    # allocator's events: the first step's working memory equals a warmed-up one's, measured on
    # GPT-2 small, CNNs (oneDNN convolutions) and the tests' models (tests/pipeline pins it), and
    # the warm-up would cost a whole real training step.
    if device.type != "cpu" or any(is_lazy(p) for p in model.parameters()):
        _hooked_steps(model, units, args, kwargs, fire, 1, loss_fn=loss_fn, after_step=after_step)
    allocations, ranges = profile_events(
        lambda: _hooked_steps(model, units, args, kwargs, fire, 1, loss_fn=loss_fn, after_step=after_step),
        cuda=device.type == "cuda", prefix="layerscope.unit.")
    # (time, 0 mark / 1 allocation, name / bytes): this device's allocations and the units' marks
    events = [(t, 1, size) for t, size, dev, _ in allocations
              if dev == device or (dev.type == device.type and device.index is None)]
    events += [(t, 0, name[len("layerscope.unit."):]) for t, name in ranges]
    return _work_from_events(events, [u.name for u in units.units])


def _work_from_events(events, names: list[str]) -> dict[str, int]:
    """Working memory per unit from a step's timed events: (time, 0, "<unit>.f" / "<unit>.b" /
    "end.f") marks and (time, 1, +/- bytes) allocations (see ``unit_work_bytes``)."""
    events = sorted(events, key=lambda e: (e[0], e[1]))
    # the live-bytes series, and the marks in the order they fell with their place in it
    live, marks_at, running = [0], [], 0
    for _, kind, v in events:
        if kind:
            running += v
            live.append(running)
        else:
            marks_at.append((v, len(live) - 1))
    work = {name: 0 for name in names}
    for j, (mark, s) in enumerate(marks_at):
        g, _, phase = mark.partition(".")
        if g == "end":
            continue
        e = next((x for m, x in marks_at[j + 1:] if m.endswith("." + phase)), len(live) - 1)
        span = live[s:e + 1]
        w = max(span) - (span[-1] if phase == "f" else span[0])
        work[names[int(g)]] = max(work[names[int(g)]], int(w))
    return work
