"""A training step (or an inference forward) run under the tracker, the op recorder and the storage
tracker, on fake tensors (a simulation) or on the model's own tensors.

The step is what a plain training loop does::

    for micro in range(accumulation):
        with autocast:                       # when asked
            out = model(*args, **kwargs)
            loss = loss_fn(out)              # default: sum of the output (or its .loss)
        loss.backward()                      # `out` is still referenced here, as in most loops
    optimizer.step()
    optimizer.zero_grad()                    # set_to_none, PyTorch's default

repeated ``steps`` times, because optimizer state exists only from the first step on.

In a simulation the model runs on fake tensors (torch's FakeTensorMode) that carry shape, dtype,
device and storage size but no data: the model's own code, autograd and the optimizer's real
``step()`` run, and every storage they create is recorded, while nothing is computed or allocated.
The user's model runs with fake copies of its parameters and buffers swapped in (as
``torch.func.functional_call`` does, but through backward too, so checkpointed blocks recompute with
them), so its own tensors are never touched.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .. import _compat
from ..costs import CostOptions
from ..errors import ForwardError, InputError, LayerscopeError
from ..trace import BACKWARD, FORWARD, LOSS, OPTIMIZER, Trace
from .inputs import iter_tensors, map_tensors
from .known import KnownIndexError, KnownValues
from .loss import StepLoss, default_loss
from .rng import PrivateRNG
from .recorder import OpRecorder
from .records import ReleasedOutput, build_trace, tensor_bytes
from .session import Session, run_backward, run_forward
from .blocks import Truncated
from .compose import Composer
from .shadow import private_params
from .actions import mark_outputs, run_actions
from .spec import StepSpec, StepWatch
from .simulation import SimulationKernels, SimulationLog, ValueReads, eager_paths
from .state import StateGuard, empty_like_on, empty_state, swapped_state
from .storage import BUFFER, GRAD, INPUT, OPT, PARAM, StorageTracker

__all__ = ["StepRun", "PassRecord", "run_steps", "fake_mode_for"]


@dataclass
class PassRecord:
    """One forward (+ backward) pass: its trace and where its ops sit on the global op clock."""

    step: int
    micro: int
    offset: int                                  # global index of the pass's first op
    trace: Trace
    spans: list[tuple[int, int]]                 # per layer call: global (first, last) forward op


@dataclass
class StepRun:
    tracker: StorageTracker | None
    passes: list[PassRecord] = field(default_factory=list)
    step_ranges: list[tuple[int, int]] = field(default_factory=list)     # global (first, last) op
    phase_ranges: list[tuple[int, str, int, int]] = field(default_factory=list)  # step, phase, first, last
    param_bytes: dict[str, int] = field(default_factory=dict)            # param name -> bytes
    grad_bytes: dict[str, int] = field(default_factory=dict)             # param name -> bytes of .grad
    optimizer_bytes: dict[str, int] = field(default_factory=dict)        # param name -> state bytes
    optimizer_other_bytes: int = 0                                       # state not keyed by a param
    param_names: dict[int, str] = field(default_factory=dict)
    # what a simulation had to make up (random draws, values read back, kernel sizes): None when real
    log: SimulationLog | None = None
    # a simulation's values known beside its fake tensors (capture/known.py): None when real
    known: KnownValues | None = None


def fake_mode_for():
    """The FakeTensorMode already active (the user's), or a new one."""
    mode = _compat.active_fake_mode()
    if mode is not None:
        return mode, False
    return _compat.new_fake_mode(allow_non_fake_inputs=True), True


def run_steps(spec: StepSpec, watch: StepWatch | None = None, *, compose: Truncated | None = None) -> StepRun:
    """Run ``spec.steps`` training steps (or one inference forward) of ``spec`` (capture/spec.py) and
    return what ``watch`` (its tracker, SDPA router and per-step callback) saw.

    In a simulation, kernels whose fake sizes are wrong or that hold scratch (capture/simulation.py)
    are sized by one real call on zeros on ``spec.device`` (``probe_kernels``; off where the prediction
    is for another device than the one simulated on). With ``watch.tracker`` None nothing is recorded
    (the measured run). ``watch.attention`` (an SdpaRouter, capture/attention.py) runs each forward's
    SDPA as a GPU target would. The model's parameters, buffers, gradients, modes and RNG state are
    restored afterwards. A placed model (``spec.placement``, a simulation only) is a private copy whose
    state is already fake tensors of the active FakeTensorMode (planning/: sharded with torch's own
    code), run as it is, with no copies swapped in, inside the context its placement returns.
    ``spec.pipeline``: each pass runs a pipeline rank's actions (PipelinePass) on the whole inputs, in
    place of one forward and backward.
    ``compose`` (a simulation of the whole model, capture/blocks.py): the shorter model runs and each pass
    is widened to the whole model's (capture/compose.py; NotComposable where it cannot stand for it).
    ``spec.loss_fn``: a callable ``output -> scalar``, or a StepLoss (capture/loss.py) bound here to the
    run's own inputs (its labels already among them: ``StepLoss.inputs``); None: ``default_loss``.
    """
    watch = watch or StepWatch()
    with spec.placement() if spec.placement is not None else contextlib.nullcontext():
        return _run(spec, watch, compose)


def _run(spec: StepSpec, watch: StepWatch, compose: Truncated | None) -> StepRun:
    model, args, kwargs = spec.model, spec.args, spec.kwargs or {}
    simulate, device, training, prepared = spec.simulate, spec.device, spec.training, spec.prepared
    tracker, attention = watch.tracker, watch.attention
    named = list(model.named_modules())
    modules = [m for _, m in named]
    guard = StateGuard(model, modules, (args, kwargs))
    rng = PrivateRNG()       # one private generator for every recorded pass of the run
    run = StepRun(tracker, log=SimulationLog(probe=spec.probe_kernels, real=not simulate)
                  if simulate or tracker is not None else None)
    fake_ctx, snapshot = contextlib.nullcontext(), []
    if simulate:
        fake_mode, own = fake_mode_for()
        fake_ctx = fake_mode if own else contextlib.nullcontext()
    try:
        with fake_ctx, eager_paths(fake_mode) if simulate and own else contextlib.nullcontext():
            if simulate:
                if prepared:
                    params, buffers = dict(model.named_parameters()), dict(model.named_buffers())
                else:
                    params, buffers = empty_state(model, device)
                given = (args, kwargs)
                args, kwargs = map_tensors((tuple(args), dict(kwargs)), lambda t: empty_like_on(t, device))
                swap = None if prepared else {**params, **buffers}
                if compose is not None and swap is not None:     # a placed model runs its own state
                    short = compose.model
                    swap = {n: swap[compose.full_path(n)] for n, _ in
                            [*short.named_parameters(), *short.named_buffers()]}
                # the values of small integer inputs (ids, labels, lengths, masks) go along
                run.known = KnownValues()
                run.known.seed_pairs(iter_tensors((args, kwargs)), iter_tensors(given))
            else:
                params = dict(model.named_parameters())
                buffers = dict(model.named_buffers())
                # a training step on a copy of the model's tree (capture/shadow.py) runs on clones of
                # CPU weights: another thread running the model never sees them change (issue 58)
                swap = private_params(model, params) if training else None
                if swap is not None:
                    params = swap
                else:
                    if training and spec.optimizer:
                        # the optimizer's step changes weights in place: undone below (without one the
                        # weights stay as they are, and a step measured allocation by allocation,
                        # partition's unit marks, sees no copy of them)
                        with torch.no_grad():
                            snapshot = [(p, p.detach().to("cpu", copy=True)) for p in params.values()]
                    for p in params.values():
                        p.grad = None

            runner = compose.model if compose is not None else model

            def call():
                with attention.mode() if attention is not None else contextlib.nullcontext():
                    return runner(*args, **kwargs)
            if spec.micro_inputs is not None:
                if simulate or spec.pipeline is not None:
                    raise InputError("micro_inputs are a measured run's, one forward a pass")
                turn = itertools.cycle(spec.micro_inputs)

                def call():  # noqa: F811 - each accumulation pass on its own micro-batch, in turn
                    a, k = next(turn)
                    with attention.mode() if attention is not None else contextlib.nullcontext():
                        return runner(*a, **k)
            pipeline = spec.pipeline
            if pipeline is not None:
                def call(m=None):  # noqa: F811 - a pipeline's forward of micro-batch m
                    with attention.mode() if attention is not None else contextlib.nullcontext():
                        return pipeline.forward(m, args, kwargs)

            def backward(loss, seeds=None):
                # ``loss``, or (a pipeline stage's backward) its outputs with the gradients ``seeds``
                if attention is None:
                    return loss.backward() if seeds is None else torch.autograd.backward(loss, seeds)
                if seeds is None:
                    loss, seeds = [loss], [torch.ones_like(loss, memory_format=torch.preserve_format)]
                # routed SDPA stays routed in the backward (a checkpointed block's recompute)
                return attention.backward(loss, seeds)
            def routed():
                # the routing around a zero-bubble backward's own autograd calls (capture/attention.py)
                return attention.mode() if attention is not None else contextlib.nullcontext()
            run.param_names = {id(p): n for n, p in params.items()}
            if tracker is not None:
                for n, p in params.items():
                    b = tracker.mark(p, PARAM)
                    run.param_bytes[n] = b.nbytes if b is not None else 0
                for b in buffers.values():
                    tracker.mark(b, BUFFER)
                for t in iter_tensors((args, kwargs)):
                    tracker.mark(t, INPUT)
            composer = None
            if compose is not None:
                runner.train(training if spec.module_mode is None else spec.module_mode)
                composer = Composer(compose, model, params, buffers, attention)
                if tracker is not None:
                    run.log.clock = lambda: tracker.clock
                    if attention is not None:
                        attention.clock = lambda: tracker.clock
            opt = _make_optimizer(spec.optimizer, list(params.values()), spec.foreach_default) \
                if training and spec.optimizer else None
            if composer is not None and opt is not None:
                composer.trim_optimizer(opt, run.param_names)
            model.train(training if spec.module_mode is None else spec.module_mode)
            loss_fn = spec.loss_fn
            if isinstance(loss_fn, StepLoss):
                # the loss of this run's own inputs (a simulation's fake ids, their values known beside them)
                loss_fn = loss_fn.bind(args, kwargs) if spec.pipeline is None and training else None
            live = _Live(named, (call, backward, routed), swap, (args, kwargs), params, buffers, opt, rng,
                         loss_fn or default_loss, composer)
            # a caller's own module hooks, on the modules that run (the shorter model's where composed)
            hooked = watch.modules(list(runner.named_modules()) if compose is not None else named) \
                if watch.modules is not None else contextlib.nullcontext()
            with hooked:
                _loop(run, spec, live, watch)
            if composer is not None:
                composer.finish(run)
    except ForwardError as e:
        # a failure after the simulation made values up (a label check read as True) names them
        if run.log is None or run.log.real or not any(k != "random" for k, _, _ in run.log.events) or \
                isinstance(e.__cause__, KnownIndexError):
            raise
        made_up = "; ".join(run.log.notes(skip=("random",))[:2])
        raise ForwardError(f"{e} -- this may come from a value the simulation had to invent: {made_up}",
                           path=e.path, module_type=e.module_type, input_shapes=e.input_shapes) from e.__cause__
    finally:
        if snapshot:
            with torch.no_grad():
                for p, saved in snapshot:
                    p.copy_(saved)
        # an untracked real step (the measured one) drew from torch's global generators
        guard.restore(rng=tracker is None and not simulate or rng.touched_global)
        if tracker is not None:
            tracker.close()
        if attention is not None:
            attention.clock = None
    return run


def _make_optimizer(optimizer, params: list[torch.Tensor], foreach_default: bool):
    try:
        opt = optimizer(params)
    except Exception as e:
        raise InputError(f"could not build the optimizer from {optimizer!r}: {type(e).__name__}: {e}") from e
    if not isinstance(opt, torch.optim.Optimizer):
        raise InputError(f"optimizer must build a torch.optim.Optimizer, got {type(opt).__name__}")
    if foreach_default:
        # On real CUDA tensors PyTorch picks the foreach implementation by default; fake tensors do
        # not qualify for that default, so make the simulated choice match the real one.
        for group in opt.param_groups:
            if "foreach" in group and group["foreach"] is None and not group.get("fused"):
                group["foreach"] = True
    return opt


@dataclass
class _Live:
    """What one run holds while its steps loop: the model's modules, the pass's callables (call,
    backward, routed), the state swapped in, the run's own inputs, parameters, buffers, optimizer and
    generator, the loss (bound) and the composer of a composed run."""

    named: list
    passes: tuple
    swap: dict | None
    inputs: tuple
    params: dict
    buffers: dict
    opt: Any
    rng: PrivateRNG
    loss_fn: Callable
    composer: Composer | None


def _loop(run: StepRun, spec: StepSpec, live: _Live, watch: StepWatch) -> None:
    tracker, on_step = run.tracker, watch.on_step
    model, named, passes, swap, inputs = spec.model, live.named, live.passes, live.swap, live.inputs
    params, buffers, opt, rng, loss_fn, composer = (live.params, live.buffers, live.opt, live.rng, live.loss_fn,
                                                    live.composer)
    simulate, training, device, pipeline, keep_output = (spec.simulate, spec.training, spec.device, spec.pipeline,
                                                         spec.keep_output)
    steps, accumulation = (spec.steps, spec.accumulation) if training else (1, 1)
    options = spec.costs or CostOptions()
    autocast_dtype = spec.autocast_dtype
    # the modules that run: the shorter model's where the pass is composed (``named`` stays the whole
    # model's: its trace is the whole model's)
    running = list(composer.tr.model.named_modules()) if composer is not None else named
    state = list(params.values()) + list(buffers.values())
    autocast = (lambda: torch.autocast(device_type=device.type, dtype=autocast_dtype)) \
        if autocast_dtype is not None else contextlib.nullcontext
    last_micro = None
    for step in range(steps):
        if on_step:
            on_step(step, "begin")
        first_op = tracker.clock + 1 if tracker else 0
        for micro in range(accumulation):
            cap = Session(model, options, track_seq=training, storage=tracker, simulated=simulate, rng=rng,
                          known=run.known)
            cap.seed_producers(inputs, state)
            offset = tracker.clock + 1 if tracker else 0
            first_block = len(tracker.blocks) if tracker else 0
            known = (run.known.assumed, run.known.cast_ones) if run.known is not None else None
            if tracker:
                tracker.pass_index = len(run.passes)
            with swapped_state(composer.tr.model if composer is not None else model, swap):
                output = _one_pass(run, cap, running, passes, autocast, loss_fn, training, pipeline, keep_output)
            if composer is not None and tracker:
                composer.widen(cap, tracker, run, offset, first_block, known)
            if tracker:
                trace = build_trace(cap, model, named, inputs, output, backward=training,
                                    options={"mode": "train" if training else "eval",
                                             "causal": options.causal, "device": str(device)})
                run.passes.append(PassRecord(step, micro, offset, trace,
                                             [(offset + c.span[0], offset + c.span[1]) for c in cap.calls]))
            del output
            last_micro = cap
        if tracker:
            # a parameter whose storage the forward replaced (FSDP2 re-pads an uneven shard when it
            # first runs) is a parameter in its new storage too
            for name, p in params.items():
                b = tracker.mark(p, PARAM)
                run.param_bytes[name] = b.nbytes if b is not None else 0
        if training:
            for name, p in params.items():
                if p.grad is not None:
                    b = tracker.mark(p.grad, GRAD) if tracker else None
                    if b is not None and step == steps - 1:
                        run.grad_bytes[name] = b.nbytes
            if watch.on_grads is not None:
                watch.on_grads(step)
        if opt is not None:
            cap = last_micro
            start = tracker.clock + 1 if tracker else 0
            cap.phase = OPTIMIZER
            if composer is not None and tracker:
                composer.optimizer_begins(tracker, opt)
            with OpRecorder(cap) if tracker else contextlib.nullcontext():
                try:
                    opt.step()
                except LayerscopeError:
                    raise
                except Exception as e:
                    raise InputError(f"optimizer.step() failed ({'fake' if simulate else 'real'} "
                                     f"parameters): {type(e).__name__}: {e}") from e
                if tracker:
                    _mark_optimizer_state(run, opt, step == steps - 1)
                opt.zero_grad()
            cap.remove()
            if composer is not None and tracker:
                composer.optimizer_ends(tracker, run)
            if tracker:
                run.phase_ranges.append((step, OPTIMIZER, start, tracker.clock))
        elif training:
            for p in params.values():
                p.grad = None
        if tracker:
            run.step_ranges.append((first_op, tracker.clock))
        if on_step:
            on_step(step, "end")


def _one_pass(run: StepRun, cap: Session, named, passes, autocast, loss_fn, training: bool, pipeline=None,
              keep_output: bool = True):
    call, backward, _ = passes
    tracker = cap.storage
    tracked = tracker is not None
    step_phase = []

    def mark_phase(phase):
        if tracker is not None:
            step_phase.append((phase, tracker.clock + 1))
        cap.phase = phase

    def pack(t):
        cap.paused = True
        try:
            if tracker is not None:
                layer = cap.stack[-1] if cap.stack and cap.phase is FORWARD else 0
                tracker.mark_saved(t, layer)
            return t.detach()
        finally:
            cap.paused = False

    saved_hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t) \
        if training and tracked else contextlib.nullcontext()
    # a simulation's own steps: kernels below the recorder (it records what they return), value
    # reads above it (it answers those itself); taken by the recorder itself when there is one
    log = run.log
    kernels = SimulationKernels(cap, log) if log is not None else None
    reads = ValueReads(cap, log) if log is not None and not log.real else None
    below, above = contextlib.nullcontext(), contextlib.nullcontext()
    if tracked:
        recorder = OpRecorder(cap, kernels, reads)
    else:
        recorder = contextlib.nullcontext()
        below = kernels if kernels is not None else below
        above = reads if reads is not None else above
    output = None
    if tracked:
        cap.install(named)
    try:
        with torch.set_grad_enabled(training), below, recorder, above:
            if pipeline is not None:
                output = run_actions(cap, named, pipeline, passes, saved_hooks, autocast, mark_phase)
            else:
                with saved_hooks:
                    mark_phase(FORWARD)
                    with autocast():
                        output = run_forward(cap, call)
                        if tracker is not None:
                            mark_outputs(tracker, output)
                        if training:
                            mark_phase(LOSS)
                            loss = loss_fn(output)
                            if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
                                raise InputError("loss_fn must return a scalar tensor")
                            if not keep_output:
                                output = ReleasedOutput(tensor_bytes(output))
                if training:
                    if tracker is not None:
                        tracker.backward_starts()
                    mark_phase(BACKWARD)
                    run_backward(cap, [m for _, m in named], lambda: backward(loss))
                    del loss
    finally:
        cap.remove()
        cap.phase = FORWARD
    if tracker is not None:
        bounds = step_phase + [(None, tracker.clock + 1)]
        for (phase, first), (_, nxt) in zip(bounds, bounds[1:]):
            run.phase_ranges.append((len(run.step_ranges), phase, first, nxt - 1))
    return output


def _mark_optimizer_state(run: StepRun, opt: torch.optim.Optimizer, last: bool) -> None:
    tracker = run.tracker
    seen: set[int] = set()
    for p, st in opt.state.items():
        name = run.param_names.get(id(p))
        for v in (st.values() if isinstance(st, dict) else ()):
            for t in iter_tensors(v):
                b = tracker.mark(t, OPT)
                if b is None or id(b) in seen:
                    continue
                seen.add(id(b))
                if not last:
                    continue
                if name is not None:
                    run.optimizer_bytes[name] = run.optimizer_bytes.get(name, 0) + b.nbytes
                else:
                    run.optimizer_other_bytes += b.nbytes
