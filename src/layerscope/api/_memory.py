"""``memory()``: one training step (or no-grad forward) simulated on fake tensors, or tracked on the
real ones, per category, over time and per layer."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..analyses.memory import memory_results
from ..capture import iter_tensors, model_device
from ..capture.attention import resolve_gpu, router_for
from ..capture.composed import composed_steps
from ..capture.guard import exclusive, gc_paused
from ..capture import measure as measure_mod
from ..capture.loss import choose_loss, given_note
from ..capture.measure import measure_cpu, measure_cuda, real_step_need, state_bytes
from ..capture.prepare import as_device, check_model, example_inputs, is_fake_model, materialize_lazy, rebatch
from ..capture.step import run_steps
from ..capture.storage import StorageTracker, cuda_block_size
from ..costs.cublas import workspace_rule
from ..costs.cuda_scratch import CudaKernels
from ..errors import ForwardError, InputError
from ..formats.exported import refuse_exported
from ..options import MemoryOptions, entry_options, optimizer_name
from ..progress import ProgressBar
from ..options import iec, parse_bytes
from ..reports.memory import MemoryReport

__all__ = ["memory", "memory_with", "host_shortfall"]


@exclusive
def memory(model: nn.Module, *args: Any, optimizer=None, training: bool = True, device=None, input_size=None,
           batch_size: int | None = None, limit=None, options: MemoryOptions | None = None,
           forward_kwargs: dict | None = None, **kwargs: Any) -> MemoryReport:
    """Memory of a training step (or, with ``training=False``, a no-grad forward), per category, over
    time and per layer. Returns a MemoryReport.

    The step is simulated on fake tensors: the model's own forward, autograd's backward and the
    optimizer's real ``step()`` run without computing or allocating, and every storage they create or
    free is recorded, so a model that fits nowhere can be planned anywhere. ``device`` is where the
    memory is predicted for (default: where the model is; "cuda" rounds every storage to the CUDA
    allocator's 512-byte blocks). ``optimizer`` is a torch.optim class, a factory taking the
    parameters, an instance (its class and defaults are used) or a name like "adamw". ``progress=True``
    shows a bar on stderr, one tick per step. ``steps``
    training steps are run (optimizer state exists from the first step on); ``accumulation`` runs that
    many forward/backward passes per step. ``loss`` is the step's loss: "auto" (the default) the model's
    own where its forward takes labels and it has a language-model head (given labels, a copy of the
    token ids, as a training loop does), else the next-token cross-entropy in fp32 where the output is
    logits over the token ids, else the sum of the output; "model", "cross-entropy" or "sum" choose one
    (a ``loss_fn(output) -> scalar`` instead is the loss); the notes say which ran. ``autocast_dtype``
    (torch.bfloat16/float16 or "bf16"/"fp16")
    runs forward and loss under torch.autocast. ``batch_size`` re-sizes the inputs along
    ``batch_dim`` (default 0). ``simulate=False`` tracks the real step on the model's own tensors
    instead (everything is restored afterwards). ``measure=True`` also runs the real step and measures
    it with the allocator (default on for CUDA models). Like every entry point, this runs a copy of the
    module tree (capture/shadow.py): another thread calling the model meanwhile sees no mode, hook or
    tensor change; a real step on a CPU model updates clones of the weights, but on a CUDA model it
    updates the model's own weights in place until they are put back (a second copy on the device
    could not fit), which another thread's forward would see. ``limit`` (bytes or "80GiB") is shown
    against the peak. What the simulation had to make up (random draws taken at their median, values
    read back from tensors that have none, kernels it could not size) is listed in ``notes``.
    ``gpu`` (a name of ``layerscope.GPUS`` or ``layerscope.gpu(...)``) predicts for that CUDA GPU: each
    ``scaled_dot_product_attention`` call runs, and saves for backward, what the kernel torch's CUDA
    rules pick there saves (flash: q, k, v, the output and a log-sum-exp; math: the probabilities);
    a CUDA prediction without one uses the H200's rules, and ``attention`` forces a kernel. A CUDA
    prediction holds cuBLAS's two persistent workspaces (the forward's thread and the backward's;
    32 MiB each on Hopper and Blackwell, costs/cublas.py) in the ``workspace`` category.
    ``keep_output=False`` lets go of the model's output once the loss is computed (a loop that
    deletes it before ``loss.backward()``, as torchtitan's does); by default it lives through the
    backward, as ``outputs = model(...)`` held until the next step does.

    Options: the named keywords above, or any other field of ``layerscope.MemoryOptions``
    (``autocast_dtype``, ``batch_dim``, ``dtypes``, ``loss``, ``loss_fn``, ``steps``, ``accumulation``,
    ``simulate``, ``measure``, ``progress``, ``gpu``, ``attention``, ``keep_output``) as a keyword, or all of them in
    ``options=MemoryOptions(...)``; an option given both in ``options=`` and as a keyword (a named one
    away from its default) is an InputError. A forward argument named like an option goes in
    ``forward_kwargs``.
    """
    opts, kwargs = entry_options(MemoryOptions, options, kwargs, forward_kwargs, optimizer=optimizer,
                                 training=training, device=device, input_size=input_size, batch_size=batch_size,
                                 limit=limit)
    return memory_with(model, args, kwargs, opts)


def memory_with(model: nn.Module, args: tuple, kwargs: dict, opts: MemoryOptions) -> MemoryReport:
    """``memory()`` once its options are an object (``max_batch_size()`` runs it per batch size)."""
    refuse_exported(model, "memory")   # issue 22: exported programs cannot run a training step
    check_model(model)
    factory, amp, training, steps, measure = (opts.optimizer, opts.autocast_dtype, opts.training, opts.steps,
                                              opts.measure)
    here = model_device(model)
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
    # where the simulation runs: fake tensors that claim the target device
    sim_device = target
    if target.type == "meta":
        sim_device = torch.device("cpu")
        notes.append("simulated as a CPU step (autocast follows CPU rules)")
    elif target.type == "cuda" and not torch.cuda.is_available():
        sim_device = torch.device("cpu")
        notes.append("no CUDA here: simulated with fake CPU tensors and CUDA's 512-byte allocation "
                     "blocks; autocast follows CPU rules, and the optimizer's foreach default is CUDA's; "
                     "cuBLAS's two workspaces are counted, scratch that other CUDA kernels (cuDNN convolution "
                     "and RNN, attention) allocate inside themselves is not")
    elif target.type == "cuda" and opts.simulate:
        notes.append("cuBLAS's two workspaces are counted, scratch that other CUDA kernels (cuDNN, attention) "
                     "allocate inside themselves is not; measure=True shows the allocator's peak beside the "
                     "prediction")
    block_size = cuda_block_size if target.type == "cuda" else None

    def new_router():
        return router_for(opts.gpu, opts.attention, simulated=opts.simulate, cuda_target=target.type == "cuda",
                          autocast_device=sim_device.type)
    router = new_router()
    options = {"device": str(target), "training": training, "optimizer": optimizer_name(factory),
               "autocast": str(amp).replace("torch.", "") if amp else None, "steps": steps if training else 1,
               "accumulation": opts.accumulation if training else 1, "simulated": opts.simulate,
               "allocation_block": 512 if block_size else 1,
               "limit": parse_bytes(opts.limit) if opts.limit is not None else None,
               **({"gpu": router.gpu.name, "attention": router.forced} if router is not None else {})}
    step_kw = dict(optimizer=factory if training else None, training=training, autocast_dtype=amp,
                   loss_fn=opts.loss_fn or loss, steps=steps, accumulation=opts.accumulation, keep_output=opts.keep_output,
                   device=sim_device if opts.simulate else here, foreach_default=target.type == "cuda",
                   probe_kernels=sim_device == target or target.type == "meta")
    cuda = target.type == "cuda"

    def new_tracker():
        return StorageTracker(block_size, workspace_rule(_capability(opts.gpu, target)) if cuda else None,
                              kernels=CudaKernels() if cuda else None)
    bar = None

    def progress():
        return ProgressBar(steps if training else 1, "simulating the step" if opts.simulate else "running the step") \
            if opts.progress else None
    with gc_paused():
        try:
            run = None
            if opts.simulate and opts.compose:
                # a run of identical blocks: five simulated, the rest composed (capture/composed.py)
                bar = progress()
                try:
                    run = composed_steps(model, args, kwargs, tracker=new_tracker(), attention=router,
                                         check_router=new_router(), on_step=_advance(bar), **step_kw)
                except Exception:   # noqa: BLE001 - NotComposable, or anything: the whole model is simulated
                    run = None      # instead, and raises the error if it is the model's
                if run is None:
                    router = new_router()
                    if bar is not None:
                        bar.close()
            if run is None:
                bar = progress()
                run = run_steps(model, args, kwargs, simulate=opts.simulate, tracker=new_tracker(), attention=router,
                                on_step=_advance(bar), **step_kw)
        except ForwardError as e:
            if loss is not None and loss.labels:
                e = _labels_hint(e)
            if not opts.simulate:
                raise e from e.__cause__
            raise _simulation_hint(e) from e.__cause__
        finally:
            if bar is not None:
                bar.close()
        tracker = run.tracker
        results = memory_results(run, model, options=options)
        measured = None
        if measure:
            own = [*model.parameters(), *model.buffers(), *iter_tensors((args, kwargs))]
            # on CUDA what the allocator counts: the device's storages, in its 512-byte blocks
            before = state_bytes(own, here, cuda_block_size) if here.type == "cuda" else state_bytes(own)
            if opts.simulate:
                why = host_shortfall(results["totals"]["peak_bytes"] - before, here, "the real step" +
                                     (f" at batch {opts.batch_size}" if opts.batch_size else ""))
                if why is not None:
                    raise InputError(f"measure=True refused: {why}; leave measure off, or a smaller batch")

            real_kw = {k: v for k, v in step_kw.items() if k not in ("device", "foreach_default", "probe_kernels")}

            def real(on_step):
                run_steps(model, args, kwargs, simulate=False, device=here, tracker=None,
                          on_step=on_step, **real_kw)

            measured = measure_cuda(real, here, options["steps"], before) if here.type == "cuda" else \
                measure_cpu(real, before, options["steps"])
        if loss is not None:
            notes.append(loss.describe())
        elif training:
            notes.append(given_note(opts.loss_fn))
        if run.log is not None:
            notes += run.log.notes()
        if run.known is not None:
            notes += run.known.notes()
        if router is not None:
            notes += router.notes(passes=len(run.passes) or 1)
        if tracker.untracked:
            notes.append(f"{tracker.untracked} tensors without a plain storage (sparse, nested) were "
                         "not tracked")
        return MemoryReport(**{**results, "measured": measured, "notes": tuple(notes)})


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
