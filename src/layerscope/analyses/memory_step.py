"""The memory of one step from its options: where it is predicted for, simulated or tracked for real,
composed or whole, measured or not, and what the notes say. What ``memory()``, ``max_batch_size()``
and ``parallel()``'s one-device case share (each wraps the fields in its report): the options object
comes in whole, and reaches capture as one StepSpec (capture/spec.py), built here once."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from ..capture import iter_tensors, model_device
from ..capture import measure as measure_mod
from ..capture.attention import resolve_gpu, router_for
from ..capture.composed import run_step
from ..capture.guard import gc_paused
from ..capture.loss import choose_loss, given_note
from ..capture.measure import measure_cpu, measure_cuda, real_step_need, state_bytes
from ..capture.notes import Note
from ..capture.prepare import as_device, check_model, example_inputs, is_fake_model, materialize_lazy, rebatch
from ..capture.spec import StepSpec, StepWatch
from ..capture.step import run_steps
from ..capture.storage import StorageTracker, cuda_block_size
from ..costs.cublas import workspace_rule
from ..costs.cuda_scratch import CudaKernels
from ..errors import ForwardError, InputError
from ..formats.exported import refuse_exported
from ..options import MemoryOptions, iec, optimizer_name, parse_bytes
from ..progress import ProgressBar
from .memory import memory_results

__all__ = ["memory_step", "host_shortfall"]


def memory_step(model: nn.Module, args: tuple, kwargs: dict, opts: MemoryOptions) -> dict[str, Any]:
    """The fields of a MemoryReport (``memory_results``' plus ``measured`` and ``notes``) for the step
    ``opts`` describes."""
    refuse_exported(model, "memory")   # issue 22: exported programs cannot run a training step
    check_model(model)
    training, steps, measure = opts.training, opts.steps, opts.measure
    here = model_device(model)
    target = _target(here, opts)
    notes = []
    real_ok = here.type not in ("meta",) and not is_fake_model(model)
    if not opts.simulate and (not real_ok or target != here):
        raise InputError(f"simulate=False tracks the real step where the model is ({here}); it needs "
                         f"real tensors there" + (f", not device={str(target)!r}" if target != here else ""))
    if measure is None:
        measure = opts.simulate and real_ok and here.type == "cuda" and target == here
    if measure and (not real_ok or target != here or here.type not in ("cpu", "cuda")):
        raise InputError(f"measure=True runs the real step on the model's device ({here}); it needs a "
                         f"CPU or CUDA model with real tensors and device left at that")
    # example inputs
    in_device = here if (not opts.simulate or measure) else torch.device("meta")
    args = example_inputs(args, kwargs, opts.input_size, opts.dtypes, opts.batch_dim, in_device, "memory")
    materialize_lazy(model, args, kwargs)
    if opts.batch_size is not None:
        args, kwargs = rebatch(args, kwargs, opts.batch_dim or 0, opts.batch_size,
                               simulated=opts.simulate and not measure)
    # the step's loss (capture/loss.py): a language model's own, given labels, by default
    loss = choose_loss(model, args, kwargs, opts.loss) if training and opts.loss_fn is None else None
    if loss is not None:
        args, kwargs = loss.inputs(args, kwargs)
    sim_device = _simulated_on(target, opts, notes)
    cuda = target.type == "cuda"
    block_size = cuda_block_size if cuda else None

    def new_router():
        return router_for(opts.gpu, opts.attention, simulated=opts.simulate, cuda_target=cuda,
                          autocast_device=sim_device.type)
    router = new_router()     # what the options name (each run routes with a fresh one)
    options = {"device": str(target), "training": training, "optimizer": optimizer_name(opts.optimizer),
               "autocast": str(opts.autocast_dtype).replace("torch.", "") if opts.autocast_dtype else None,
               "steps": steps if training else 1,
               "accumulation": opts.accumulation if training else 1, "simulated": opts.simulate,
               "allocation_block": 512 if block_size else 1,
               "limit": parse_bytes(opts.limit) if opts.limit is not None else None,
               **({"gpu": router.gpu.name, "attention": router.forced} if router is not None else {})}
    spec = StepSpec(model, args, kwargs, training=training, optimizer=opts.optimizer if training else None,
                    autocast_dtype=opts.autocast_dtype, loss_fn=opts.loss_fn or loss, steps=steps,
                    accumulation=opts.accumulation, keep_output=opts.keep_output, simulate=opts.simulate,
                    device=sim_device if opts.simulate else here, foreach_default=cuda,
                    probe_kernels=sim_device == target or target.type == "meta", compose=opts.compose)

    def watch():
        bar = ProgressBar(steps if training else 1, "simulating the step" if opts.simulate else "running the step") \
            if opts.progress else None
        return StepWatch(tracker=StorageTracker(block_size, workspace_rule(_capability(opts.gpu, target))
                                                if cuda else None, kernels=CudaKernels() if cuda else None),
                         attention=new_router(),
                         on_step=_advance(bar), close=bar.close if bar is not None else None)
    with gc_paused():
        try:
            run, ran = run_step(spec, watch, new_router)
        except ForwardError as e:
            if loss is not None and loss.labels:
                e = _labels_hint(e)
            if not opts.simulate:
                raise e from e.__cause__
            raise _simulation_hint(e) from e.__cause__
        results = memory_results(run, model, options=options)
        measured = _measured(spec, here, results, opts, options["steps"]) if measure else None
        notes += _run_notes(run, ran.attention, loss, opts)
        return {**results, "measured": measured, "notes": tuple(notes)}


def _run_notes(run, router, loss, opts: MemoryOptions) -> list[Note]:
    """What the run's notes say (records; reports/notes.py words them): the loss that ran, what the
    simulation made up or knew, how attention was priced, what the tracker could not follow."""
    notes = []
    if loss is not None:
        notes.append(loss.describe())
    elif opts.training:
        notes.append(given_note(opts.loss_fn))
    if run.log is not None:
        notes += run.log.records()
    if run.known is not None:
        notes += run.known.notes()
    if router is not None:
        notes += router.notes(passes=len(run.passes) or 1)
    if run.tracker.untracked:
        notes.append(Note("memory-untracked", {"count": run.tracker.untracked}))
    return notes


def _target(here: torch.device, opts: MemoryOptions) -> torch.device:
    """The device the memory is predicted for."""
    target = as_device(opts.device) if opts.device is not None else here
    if opts.gpu is not None or opts.attention != "auto":
        # a GPU or an attention kernel named: the prediction is for CUDA
        if opts.device is not None and target.type == "cpu":
            raise InputError(f"gpu= and attention= predict for a CUDA GPU; device={opts.device!r} predicts for "
                             f"the CPU (leave device out, or device='cuda')")
        if target.type != "cuda":
            target = torch.device("cuda")
    if target.type == "cuda" and target.index is None and torch.cuda.is_available():
        target = torch.device("cuda", torch.cuda.current_device())
    return target


def _simulated_on(target: torch.device, opts: MemoryOptions, notes: list) -> torch.device:
    """Where the simulation runs: fake tensors that claim the target device (noted where they cannot)."""
    if target.type == "meta":
        notes.append(Note("memory-meta-as-cpu", {}))
        return torch.device("cpu")
    if target.type == "cuda" and not torch.cuda.is_available():
        notes.append(Note("memory-no-cuda", {}))
        return torch.device("cpu")
    if target.type == "cuda" and opts.simulate:
        notes.append(Note("memory-cuda-workspaces", {}))
    return target


def _measured(spec: StepSpec, here: torch.device, results: dict, opts: MemoryOptions, steps: int):
    """The real step measured with the allocator (refused where the device cannot hold it)."""
    model = spec.model
    own = [*model.parameters(), *model.buffers(), *iter_tensors((spec.args, spec.kwargs))]
    # on CUDA what the allocator counts: the device's storages, in its 512-byte blocks
    before = state_bytes(own, here, cuda_block_size) if here.type == "cuda" else state_bytes(own)
    if opts.simulate:
        why = host_shortfall(results["totals"]["peak_bytes"] - before, here, "the real step" +
                             (f" at batch {opts.batch_size}" if opts.batch_size else ""))
        if why is not None:
            raise InputError(f"measure=True refused: {why}; leave measure off, or a smaller batch")
    real_spec = dataclasses.replace(spec, simulate=False, device=here, foreach_default=False, probe_kernels=True,
                                    compose=False)

    def real(on_step):
        run_steps(real_spec, StepWatch(on_step=on_step))

    return measure_cuda(real, here, steps, before) if here.type == "cuda" else measure_cpu(real, before, steps)


def host_shortfall(added: int, device: torch.device, what: str) -> str | None:
    """Why a real step that adds ``added`` bytes (its simulated peak less what is already held) must
    not run on ``device``: that with ``REAL_STEP_MARGIN`` exceeds what the device has available (issue
    58: a measured step the host cannot hold is killed by the kernel, not refused). None: it may run,
    or the available memory cannot be read."""
    need, free = real_step_need(added), measure_mod.available_bytes(device)
    if free is None or need <= free:
        return None
    ratio, fixed = measure_mod.REAL_STEP_MARGIN
    where = "the host has" if device.type == "cpu" else f"{device} has"
    return (f"{what} would need {iec(need)} (its predicted {iec(max(0, added))} + {ratio:.0%} + {iec(fixed)} "
            f"for what the simulation cannot see) and {where} {iec(free)} available")


def _advance(bar):
    return (lambda step, when: bar.advance() if when == "end" else None) if bar is not None else None


def _capability(gpu, target: torch.device) -> tuple[int, int]:
    """The compute capability predicted for: the named GPU's, else the CUDA device's here, else the
    GPU table's default row's (as attention is priced)."""
    if gpu is None and torch.cuda.is_available():
        return torch.cuda.get_device_capability(target)
    return resolve_gpu(gpu).capability


def _labels_hint(err: ForwardError) -> ForwardError:
    """The forward failed where the step gave it labels the caller did not: say so, and how to leave them out."""
    new = ForwardError(f"{err} -- the step gave the forward labels (a copy of the token ids) for the model's own "
                       "loss: loss='cross-entropy' or 'sum' leaves them out", path=err.path,
                       module_type=err.module_type, input_shapes=err.input_shapes)
    new.__cause__ = err.__cause__
    return new


def _simulation_hint(err: ForwardError) -> ForwardError:
    cause = type(err.__cause__).__name__ if err.__cause__ is not None else ""
    if cause in ("DataDependentOutputException", "DynamicOutputShapeException",
                 "UnsupportedOperatorException", "GuardOnDataDependentSymNode"):
        return ForwardError(f"{err} -- the simulation runs on fake tensors without values, and this op "
                            "needs them; track the real step instead with simulate=False",
                            path=err.path, module_type=err.module_type, input_shapes=err.input_shapes)
    return err
