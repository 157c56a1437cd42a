"""Thin public entry points: analyze(), summary(), activations(), memory(), max_batch_size()."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from .capture import StateGuard, capture, iter_tensors, model_device
from .capture.guard import exclusive, gc_paused
from .capture.prepare import (as_device, check_model, example_inputs, float_dtype, is_fake_model, micro_batch,
                              prepare_inputs, rebatch)
from .costs import CostOptions
from .errors import ForwardError, InputError, LayerscopeError
from .options import AnalyzeOptions, MemoryOptions, ProfileOptions, forward_inputs, optimizer_name
from .pipeline.units import units_from_memory, with_latencies, with_work
from .progress import ProgressBar
from .report import Report

__all__ = ["analyze", "activations", "memory", "max_batch_size", "BatchFit", "partition"]


@exclusive
def analyze(model: nn.Module, *args: Any, input_size=None, dtypes=None, batch_dim: int | None = None,
            device=None, mode: str = "eval", backward: bool = False, causal: str = "dense",
            costs=None, forward_kwargs: dict | None = None, **kwargs: Any) -> Report:
    """Analyse one forward (and, with ``backward=True``, one backward) of ``model``.

    Args and kwargs pass to ``model.forward`` as they are (dicts, lists, token ids, ...); or give
    ``input_size`` (with ``dtypes`` and ``batch_dim``) to build example inputs. ``device='meta'`` runs
    a real model on meta copies of its weights, so nothing is computed. ``mode`` is "eval", "train"
    or "same" (leave the model's flags as they are); the model's own state is restored afterwards.
    ``causal="unmasked"`` counts only the unmasked part of causal attention. ``costs`` is a
    ``layerscope.costs.CostRegistry`` to price ops with instead of the default one (eager modules only;
    ``default_registry().copy()`` then ``register``/``override``); an op it has no formula for is
    uncounted in coverage. A forward argument named like one of these options (``mode``, ``device``,
    ``costs``, ...) goes in ``forward_kwargs={"mode": ...}``: keywords an option takes are options.
    """
    kwargs = forward_inputs(kwargs, forward_kwargs)
    if costs is not None:
        _check_costs(model, costs)
    # torch.export / torch.compile front doors (issue 22): an ExportedProgram or ep.module() runs its
    # graph (formats/exported.py); a compiled module is analysed as its original module, with a note
    from .formats.exported import route_analyze
    routed = route_analyze(model, args, kwargs, input_size=input_size, dtypes=dtypes, batch_dim=batch_dim,
                           device=device, mode=mode, backward=backward, causal=causal, analyze=analyze,
                           analyze_exported=analyze_exported)
    if routed is not None:
        return routed
    check_model(model)
    AnalyzeOptions(mode=mode, backward=backward, causal=causal)          # checked once, here
    if isinstance(model, torch.jit.ScriptModule):
        return _analyze_script(model, args, kwargs, input_size, dtypes, batch_dim, device, mode, backward,
                               causal)
    args, kwargs, on_meta = prepare_inputs(model, args, kwargs, input_size, dtypes, batch_dim, device)
    with gc_paused():
        try:
            trace, _ = capture(model, args, kwargs, mode=mode, backward=backward, on_meta=on_meta,
                               options=CostOptions(causal=causal, registry=costs))
        except ForwardError as e:
            if not (on_meta or model_device(model).type == "meta"):
                raise
            raise _meta_hint(e) from e.__cause__
        return Report(trace, model)


def _check_costs(model, costs) -> None:
    """analyze(costs=...): a CostRegistry, for an eager module (the exported, compiled and TorchScript
    front doors price ops with the default registry)."""
    from .costs import CostRegistry
    from .formats.exported import compiled_original, is_exported_module
    if not isinstance(costs, CostRegistry):
        raise InputError(f"costs must be a layerscope.costs.CostRegistry (default_registry().copy()), got "
                         f"{type(costs).__name__}")
    if (isinstance(model, (torch.export.ExportedProgram, torch.jit.ScriptModule))
            or compiled_original(model) is not None or is_exported_module(model)):
        raise InputError("costs= applies to an eager nn.Module; an exported, compiled or TorchScript model "
                         "is priced with the default cost registry")


def analyze_onnx(model, input_shapes: dict | None = None, costs=None) -> Report:
    """Analyse an ONNX model (a path or an ``onnx.ModelProto``) into the same Report as a PyTorch
    model: layers follow the module paths the exporter recorded (else one layer per node), costs
    follow the same conventions, and ``report.graph`` holds the nodes (attributes with defaults,
    shapes, params, MACs, FLOPs, bytes read and written), the op histogram and the peak activation
    memory. ``input_shapes``: ``{input name: shape}`` and/or ``{symbolic dim: value}``; dims left
    symbolic keep their names, and nodes they make unknown are listed in coverage. ``costs``: a
    ``layerscope.costs.CostRegistry`` whose ONNX op types (``reg.onnx``) price the nodes instead of the
    default one's (``default_registry().copy()`` then ``reg.onnx.register``/``override``); an op type it
    has no formula for is uncounted in coverage. Needs the ``onnx`` extra; external data is never read."""
    import importlib.util
    if costs is not None:
        from .costs import CostRegistry
        if not isinstance(costs, CostRegistry):
            raise InputError(f"costs must be a layerscope.costs.CostRegistry (default_registry().copy()), got "
                             f"{type(costs).__name__}")
    if importlib.util.find_spec("onnx") is None:
        raise InputError("ONNX analysis needs the onnx package: pip install 'layerscope[onnx]'")
    from .formats.onnx import onnx_trace
    trace, graph = onnx_trace(model, input_shapes, costs)
    return Report(trace, graph=graph)


def _analyze_script(model, args, kwargs, input_size, dtypes, batch_dim, device, mode, backward, causal):
    """A whole ScriptModule given to analyze(): its hooks never run inside TorchScript, so it goes
    the TorchScript path (its graph run node by node), which analyses one forward on cpu."""
    why = ("backward=True" if backward else "keyword inputs" if kwargs else
           f"device={device!r}" if device is not None and torch.device(device).type != "cpu" else
           "batch_dim" if batch_dim is not None else f"causal={causal!r}" if causal != "dense" else None)
    if why:
        raise InputError(f"a TorchScript module is analysed through its graph (analyze_torchscript): one "
                         f"forward on cpu with positional inputs; {why} is not supported for it")
    flags = [(m, m.training) for m in model.modules()]
    try:
        if mode != "same":
            model.train(mode == "train")
        return analyze_torchscript(model, *args, input_size=input_size, dtypes=dtypes)
    finally:
        for m, training in flags:
            m.training = training


@exclusive
def analyze_exported(program, *args: Any, input_size=None, dtypes=None, device=None, causal: str = "dense",
                     **kwargs: Any) -> Report:
    """Analyse a torch.export program (an ``ExportedProgram``, or a ``.pt2`` path loaded with
    ``torch.export.load``, which runs no pickled code) into the same Report as ``analyze()`` of the
    eager model: its ATen graph runs node by node under the same op recorder, and each node's
    ``nn_module_stack`` opens and closes the module calls, so layers keep the original module paths.
    Inputs: as given (``input_size`` builds them), else the example inputs stored in the program; a
    symbolic dim they do not settle is named in an error, never sized 0. The graph runs as exported
    (its train/eval behaviour fixed at export), forward only, on CPU or ``device="meta"``."""
    from .capture.inputs import make_inputs
    from .formats.exported import exported_trace, load_exported
    ep = load_exported(program)
    AnalyzeOptions(causal=causal)
    if input_size is not None:
        if args or kwargs:
            raise InputError("give example inputs or input_size, not both")
        args = tuple(make_inputs(input_size, dtypes, None, torch.device("cpu")))
    elif dtypes is not None:
        raise InputError("dtypes only applies together with input_size")
    with gc_paused():
        return Report(exported_trace(ep, tuple(args), kwargs, device=device,
                                     options=CostOptions(causal=causal)))


@exclusive
def analyze_torchscript(model, *example_inputs: Any, input_size=None, dtypes=None) -> Report:
    """Analyse a TorchScript module (a path loaded with ``torch.jit.load``, never pickle, or a
    ScriptModule) on example inputs (or ``input_size``): its inlined forward graph runs node by node
    under the same op recorder as ``analyze()``, so layers, parameters, shapes and costs come out
    the same. The module is run as it is (its train/eval flags), on CPU, without gradients."""
    from .capture.inputs import make_inputs
    from .formats.torchscript import load_torchscript, torchscript_trace
    module = load_torchscript(model)
    if input_size is not None:
        if example_inputs:
            raise InputError("give example inputs or input_size, not both")
        example_inputs = tuple(make_inputs(input_size, dtypes, None, torch.device("cpu")))
    if not example_inputs:
        raise InputError("a TorchScript model needs example inputs (or input_size) to analyse")
    with gc_paused():
        return Report(torchscript_trace(module, tuple(example_inputs)), module)


def onnx_tile(model, block=(64, 64, 64), ops=("Gemm", "MatMul"), nodes=None, input_shapes=None,
              verify: bool = False):
    """Rewrite every Gemm/MatMul (or the ``nodes`` named) of an ONNX model into Split + block
    Gemm/MatMul + Sum + Concat of at most ``block`` = (M, K, N), the bias added once; the result is
    checked with onnx.checker. Returns a TileResult (``.model``, ``.tiled``, ``.skipped``,
    ``.blocks``, ``.save(path)``); with ``verify=True`` its ``.verified`` holds onnxruntime's
    comparison with the original on random inputs (max abs error, MSE)."""
    from .formats.onnx_rewrite import onnx_tile as tile, verify_tiling
    res = tile(model, block=block, ops=tuple(ops), nodes=nodes, input_shapes=input_shapes)
    if verify:
        res.verified = verify_tiling(model, res, input_shapes=input_shapes)
    return res


@exclusive
def activations(model: nn.Module, *args: Any, select=None, mode: str = "eval", forward_kwargs: dict | None = None,
                **kwargs: Any) -> dict[str, Any]:
    """Detached outputs of the selected layers for one no-grad forward.

    ``select``: module classes and/or fnmatch patterns on the module path. Keys are module paths; a
    module called more than once adds keys ``path[1]``, ``path[2]``, ... for its later calls.
    """
    from .capture.activations import collect_activations
    kwargs = forward_inputs(kwargs, forward_kwargs)
    check_model(model)
    AnalyzeOptions(mode=mode)
    return collect_activations(model, args, kwargs, select, mode)


# ---- memory ---------------------------------------------------------------------------------------


@exclusive
def memory(model: nn.Module, *args: Any, optimizer=None, training: bool = True, autocast_dtype=None,
           device=None, batch_dim: int | None = None, input_size=None, dtypes=None,
           batch_size: int | None = None, loss_fn=None, steps: int = 2, accumulation: int = 1,
           simulate: bool = True, measure: bool | None = None, limit=None, progress: bool = False,
           forward_kwargs: dict | None = None, **kwargs: Any):
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
    many forward/backward passes per step. ``loss_fn(output) -> scalar`` defaults to the output's
    ``loss`` or the sum of the output. ``autocast_dtype`` (torch.bfloat16/float16 or "bf16"/"fp16")
    runs forward and loss under torch.autocast. ``batch_size`` re-sizes the inputs along
    ``batch_dim`` (default 0). ``simulate=False`` tracks the real step on the model's own tensors
    instead (everything is restored afterwards). ``measure=True`` also runs the real step and measures
    it with the allocator (default on for CUDA models). ``limit`` (bytes or "80GiB") is shown
    against the peak. What the simulation had to make up (random draws taken at their median, values
    read back from tensors that have none, kernels it could not size) is listed in ``notes``.
    """
    kwargs = forward_inputs(kwargs, forward_kwargs)
    from .analyses.memory import memory_results
    from .render.views import MemoryReport
    from .capture.measure import measure_cpu, measure_cuda, state_bytes
    from .capture.step import run_steps
    from .capture.storage import StorageTracker, cuda_block_size
    from .formats.exported import refuse_exported
    from .render.units import parse_bytes

    refuse_exported(model, "memory")   # issue 22: exported programs cannot run a training step
    check_model(model)
    opts = MemoryOptions(training=training, optimizer=optimizer, autocast=autocast_dtype, steps=steps,
                         accumulation=accumulation, batch_size=batch_size)
    factory, amp = opts.optimizer, opts.autocast
    here = model_device(model)
    target = as_device(device) if device is not None else here
    if target.type == "cuda" and target.index is None and torch.cuda.is_available():
        target = torch.device("cuda", torch.cuda.current_device())
    notes = []
    real_ok = here.type not in ("meta",) and not is_fake_model(model)
    if not simulate and (not real_ok or target != here):
        raise InputError(f"simulate=False tracks the real step where the model is ({here}); it needs "
                         f"real tensors there" + (f", not device={str(target)!r}" if target != here else ""))
    if measure is None:
        measure = simulate and real_ok and here.type == "cuda" and target == here
    if measure and (not real_ok or target != here or here.type not in ("cpu", "cuda")):
        raise InputError(f"measure=True runs the real step on the model's device ({here}); it needs a "
                         f"CPU or CUDA model with real tensors and device left at that")
    # example inputs
    in_device = here if (not simulate or measure) else torch.device("meta")
    args = example_inputs(args, kwargs, input_size, dtypes, batch_dim, in_device, "memory")
    if batch_size is not None:
        args, kwargs = rebatch(args, kwargs, batch_dim or 0, batch_size)
    # where the simulation runs: fake tensors that claim the target device
    sim_device = target
    if target.type == "meta":
        sim_device = torch.device("cpu")
        notes.append("simulated as a CPU step (autocast follows CPU rules)")
    elif target.type == "cuda" and not torch.cuda.is_available():
        sim_device = torch.device("cpu")
        notes.append("no CUDA here: simulated with fake CPU tensors and CUDA's 512-byte allocation "
                     "blocks; autocast follows CPU rules, and the optimizer's foreach default is CUDA's; "
                     "scratch that CUDA kernels (cuBLAS, cuDNN RNN reserve, attention) allocate inside "
                     "themselves is not counted")
    elif target.type == "cuda" and simulate:
        notes.append("scratch that CUDA kernels (cuBLAS, cuDNN, attention) allocate inside themselves is "
                     "not counted; measure=True shows the allocator's peak beside the prediction")
    block_size = cuda_block_size if target.type == "cuda" else None
    options = {"device": str(target), "training": training, "optimizer": optimizer_name(factory),
               "autocast": str(amp).replace("torch.", "") if amp else None, "steps": steps if training else 1,
               "accumulation": accumulation if training else 1, "simulated": simulate,
               "allocation_block": 512 if block_size else 1,
               "limit": parse_bytes(limit) if limit is not None else None}
    step_kw = dict(optimizer=factory if training else None, training=training, autocast_dtype=amp,
                   loss_fn=loss_fn, steps=steps, accumulation=accumulation)
    tracker = StorageTracker(block_size)
    bar = ProgressBar(steps if training else 1, "simulating the step" if simulate else "running the step") \
        if progress else None
    with gc_paused():
        try:
            run = run_steps(model, args, kwargs, simulate=simulate, device=sim_device if simulate else here,
                            tracker=tracker, foreach_default=target.type == "cuda",
                            probe_kernels=sim_device == target or target.type == "meta",
                            on_step=(lambda step, when: bar.advance() if when == "end" else None) if bar else None,
                            **step_kw)
        except ForwardError as e:
            if not simulate:
                raise
            raise _simulation_hint(e) from e.__cause__
        finally:
            if bar is not None:
                bar.close()
        measured = None
        if measure:
            before = state_bytes([*model.parameters(), *model.buffers(), *iter_tensors((args, kwargs))])

            def real(on_step):
                run_steps(model, args, kwargs, simulate=False, device=here, tracker=None,
                          on_step=on_step, **step_kw)

            measured = measure_cuda(real, here, options["steps"]) if here.type == "cuda" else \
                measure_cpu(real, before, options["steps"])
        if run.log is not None:
            notes += run.log.notes()
        if tracker.untracked:
            notes.append(f"{tracker.untracked} tensors without a plain storage (sparse, nested) were "
                         "not tracked")
        return MemoryReport(**memory_results(run, model, options=options, measured=measured, notes=notes))


def _meta_hint(err: ForwardError) -> ForwardError:
    return ForwardError(f"{err} -- on meta, tensors have shapes but no values: code that reads values "
                        "(routing tokens to experts by index, masks built with nonzero or .tolist()) "
                        "cannot run there; analyse the model on cpu instead",
                        path=err.path, module_type=err.module_type, input_shapes=err.input_shapes)


def _simulation_hint(err: ForwardError) -> ForwardError:
    cause = type(err.__cause__).__name__ if err.__cause__ is not None else ""
    if cause in ("DataDependentOutputException", "DynamicOutputShapeException",
                 "UnsupportedOperatorException", "GuardOnDataDependentSymNode"):
        return ForwardError(f"{err} -- the simulation runs on fake tensors without values, and this op "
                            "needs them; track the real step instead with simulate=False",
                            path=err.path, module_type=err.module_type, input_shapes=err.input_shapes)
    return err


class BatchFit:
    """Result of max_batch_size: the largest batch whose predicted peak fits the limit."""

    def __init__(self, batch_size: int, peak_bytes: int | None, limit_bytes: int, samples, report):
        self.batch_size = batch_size
        self.peak_bytes = peak_bytes
        self.limit_bytes = limit_bytes
        self.samples = tuple(samples)   # (batch size, predicted peak) for every simulated batch
        self.report = report            # the MemoryReport at batch_size (None when nothing fits)
        # (batch size, measured peak) of the real steps that checked the answer (none: not checked)
        self.measured: tuple[tuple[int, int], ...] = ()

    def __repr__(self) -> str:
        from .render.units import iec
        peak = iec(self.peak_bytes) if self.peak_bytes is not None else "--"
        return (f"<BatchFit batch_size={self.batch_size} peak={peak} limit={iec(self.limit_bytes)} "
                f"simulations={len(self.samples)}>")


@exclusive
def max_batch_size(model: nn.Module, *args: Any, limit, batch_dim: int = 0, max_batch: int = 1 << 20,
                   forward_kwargs: dict | None = None, **kwargs: Any) -> BatchFit:
    """The largest batch size whose predicted peak (``memory(...)`` with the same arguments) fits
    ``limit`` (bytes, or a string such as "80GiB"). Peaks at batch 1 and 2 give a line; the batch it
    predicts and the one above are simulated, which proves the answer where the peak is affine in the
    batch size (4 simulations); elsewhere a line through neighbouring batches predicts again, then
    bisection brackets it. The result is always verified by a simulation at that batch and one above
    it (``BatchFit.samples``: every batch simulated). With real weights on the device planned for, one real
    step at the answer is then measured with the allocator (``BatchFit.measured``) and the batch is
    lowered until the measured peak fits, so scratch the simulation cannot see (oneDNN convolution
    workspace) never makes the answer too large."""
    from .render.units import parse_bytes
    limit_bytes = parse_bytes(limit)
    reports: dict[int, Any] = {}

    def peak(b: int) -> int:
        if b not in reports:
            reports[b] = memory(model, *args, batch_dim=batch_dim, batch_size=b, forward_kwargs=forward_kwargs,
                                **kwargs)
        return reports[b].peak_bytes

    def result(b: int) -> BatchFit:
        samples = sorted((k, r.peak_bytes) for k, r in reports.items())
        return BatchFit(b, reports[b].peak_bytes if b else None, limit_bytes, samples,
                        reports.get(b))

    def done(b: int) -> BatchFit:
        return _checked(result(b), model, args, kwargs, batch_dim, limit_bytes, reports, forward_kwargs)

    if peak(1) > limit_bytes:
        return done(0)
    slope = peak(2) - peak(1)
    if peak(2) > limit_bytes:
        return done(1)
    if slope <= 0:
        raise InputError("the predicted peak does not grow with the batch size; check batch_dim")
    if max_batch <= 2:
        return done(max_batch)
    # The answer is the largest batch that fits, once one that fits (lo) and the next that does not
    # (hi = lo + 1) are both simulated, or lo reaches max_batch. Where the peak is affine in the
    # batch size, the line through batches 1 and 2 predicts the answer exactly: it and one above are
    # simulated to prove it (4 simulations in all). Where it is not (the peak moves from one phase
    # to another as activations grow, or allocation blocks round), the line through the last two
    # batches simulated, next to each other, predicts again; then doubling and bisection, as before.
    lo, hi = 2, None

    def settled() -> bool:
        return lo >= max_batch or hi == lo + 1

    def fits(b: int) -> bool:
        nonlocal lo, hi
        ok = peak(b) <= limit_bytes
        if ok:
            lo = max(lo, b)
        else:
            hi = b if hi is None else min(hi, b)
        return ok

    b = min(max_batch, max(3, 1 + (limit_bytes - peak(1)) // slope))
    for _ in range(3):
        # the prediction, and its neighbour on the side that would prove it
        near = b + 1 if fits(b) else b - 1
        if settled():
            break
        if lo < near < (hi if hi is not None else max_batch + 1):
            fits(near)
            if settled():
                break
        a, z = min(b, near), max(b, near)
        local = peak(z) - peak(a) if (a in reports and z in reports and z == a + 1) else 0
        if local <= 0:
            break
        b = a + (limit_bytes - peak(a)) // local      # the last batch on the local line that fits
        b = min(max_batch, max(lo + 1, b if hi is None else min(b, hi - 1)))
        if b in reports:
            break
    if settled():
        return done(lo)
    b = lo
    while hi is None:  # doubling until one fails
        b = min(max_batch, b * 2)
        if fits(b) and b >= max_batch:
            return done(b)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        fits(mid)
    return done(lo)


def _checked(fit: "BatchFit", model, args, kwargs, batch_dim, limit_bytes, reports, forward_kwargs) -> "BatchFit":
    """Where the model has real weights on the device planned for, measure one real step at the
    answer (as partition() measures working memory) and step down while the measured peak exceeds
    the limit: scratch that kernels allocate inside themselves (oneDNN convolutions) is invisible to
    the simulation, so a predicted fit is not proof. The answer is never a batch that did not fit."""
    b = fit.batch_size
    if b < 1 or kwargs.get("simulate") is False or kwargs.get("measure") is False or is_fake_model(model):
        return fit
    here = model_device(model)
    device = kwargs.get("device")
    if here.type not in ("cpu", "cuda") or (device is not None and torch.device(device) != here):
        return fit
    measured = {}
    while b >= 1:
        rep = memory(model, *args, batch_dim=batch_dim, batch_size=b, measure=True, forward_kwargs=forward_kwargs,
                     **{k: v for k, v in kwargs.items() if k != "measure"})
        measured[b] = rep.measured.peak_bytes
        if rep.measured.peak_bytes <= limit_bytes:
            reports[b] = rep
            break
        b -= 1
    samples = sorted((k, r.peak_bytes) for k, r in reports.items())
    out = BatchFit(b, reports[b].peak_bytes if b else None, limit_bytes, samples, reports.get(b))
    out.measured = tuple(sorted(measured.items()))
    return out


@exclusive
def partition(model_or_report, *args: Any, stages: int, by="flops", memory_limit=None,
              schedule: str = "1f1b", microbatches: int = 1, optimizer=None, stages_per_rank: int = 2,
              batch_dim: int = 0, input_size=None, dtypes=None, autocast_dtype=None, device=None,
              latency_repeats: int = 5, loss_fn=None, measure_working: bool | None = None,
              forward_kwargs: dict | None = None, objective: str | None = None, roofline=None,
              link_bandwidth: float | None = None, optimizer_bandwidth: float | None = None, cuts=None,
              return_outputs: bool = True, count_inputs: bool | None = None, target_bytes: int = 0,
              **kwargs: Any):
    """Split a model into ``stages`` pipeline stages, each fitting ``memory_limit`` (bytes or "16GiB";
    a list gives one limit per stage). Returns a StagePlan.

    ``objective``: "step_time" — the smallest predicted time of one training step under
    ``schedule``, simulated from each stage's forward and backward time per micro-batch, the sends
    across cuts (``link_bandwidth``, bytes/s) and each rank's optimizer step
    (``optimizer_bandwidth``, bytes/s); the default when the costs are times (``by="latency"`` or
    ``"roofline"``). "bottleneck" — the smallest largest stage cost; the default otherwise.
    "uniform" — equal numbers of the repeated blocks per stage (torchtitan's default split), for
    comparison. ``cuts``: take this split instead (where stages 1 .. K-1 begin: unit indices or
    split point names, as ``plan.split_points`` gives them). With times, the plan states the
    predicted step time, bubble and per-rank busy time and draws the step (``plan.timeline``).

    ``model_or_report``: a model with its example inputs (the whole batch; it is cut into
    ``microbatches`` chunks along ``batch_dim`` as the schedule will), a MemoryReport (of one
    micro-batch) or a Report (costs and parameters only: no activation memory). ``by``: "flops"
    (forward + backward), "macs", "params", "memory", "latency" (forward and backward times measured
    here on the real model), "roofline" (times predicted from each unit's FLOPs and bytes moved under
    ``roofline``: a device name from the built-in table such as "H100", ``(peak_flops,
    peak_bytes_per_s)``, or "measure"/"auto": measured on this machine) or a callable Unit -> cost. ``schedule``: "gpipe", "1f1b", "interleaved" (``stages_per_rank`` stages
    on each rank), "zb" (torch's ScheduleInterleavedZeroBubble, placed as interleaved) or "zbv"
    (ScheduleZBVZeroBubble: two stages per rank in a V). ``optimizer`` (class, factory, instance or name) sets the optimizer state counted
    in each stage's memory; the training step is simulated on fake tensors, so a model on the meta
    device plans without memory. ``loss_fn(output) -> scalar`` (as in ``memory()``; default: the
    output's ``loss`` or its sum) sets the loss's working memory, which the last stage holds.
    ``measure_working`` (default: when the model has real weights and is planned for its own device
    without autocast) runs one real training step of a micro-batch to measure each unit's working
    memory there (kernel scratch buffers that simulation cannot see); a unit's working memory is the
    larger of simulated and measured.

    What the caller of ``schedule.step()`` keeps alive, by default as torch's defaults keep it:
    ``return_outputs=True`` (``step()``'s own default) plans for the last stage keeping every
    micro-batch's output and their concatenation (False: the setting that saves that memory, when
    the loop calls ``step(..., return_outputs=False)``); ``count_inputs`` (default: when a model and
    its inputs are given) counts the whole batch's inputs on the first stage; ``target_bytes`` the
    whole batch's targets on the last.
    """
    kwargs = forward_inputs(kwargs, forward_kwargs)
    from .memory_report import MemoryReport
    from .pipeline.partition import build_plan
    from .render.views import view
    from .pipeline.units import split_units, unit_latencies, unit_work_bytes

    notes: list[str] = []
    options = {"optimizer": None, "autocast": None}
    if not isinstance(microbatches, int) or microbatches < 1:      # before micro_batch() divides by it
        raise InputError(f"microbatches must be a positive integer, got {microbatches!r}")
    if isinstance(model_or_report, Report):
        units = split_units(model_or_report.trace, model=model_or_report._model() if model_or_report._model
                            else None)
        notes.append("planned from a Report: activations and optimizer state are not counted "
                     "(pass the model, or a MemoryReport, for memory-aware plans)")
    elif isinstance(model_or_report, MemoryReport):
        rep = model_or_report
        units = units_from_memory(rep, rep._model() if rep._model else None)
        options.update(optimizer=rep.options.get("optimizer"), autocast=rep.options.get("autocast"))
    else:
        from .formats.exported import refuse_exported
        refuse_exported(model_or_report, "partition")   # issue 22
        model = check_model(model_or_report)
        args = example_inputs(args, kwargs, input_size, dtypes, None, model_device(model), "partition")
        mb_args, mb_kwargs, mb = micro_batch(args, kwargs, microbatches, batch_dim)
        # one simulated step: the units take the last pass's trace, per-layer memory and the
        # optimizer's state, which its first step() creates; a second step only adds that state as a
        # constant under every live-bytes difference the units keep (checked equal, tests/pipeline)
        rep = memory(model, *mb_args, optimizer=optimizer, autocast_dtype=autocast_dtype, device=device,
                     steps=1, batch_dim=batch_dim, loss_fn=loss_fn, forward_kwargs=mb_kwargs)
        no_data = model_device(model).type == "meta" or is_fake_model(model)
        if by == "latency" and no_data:
            raise InputError("by='latency' times the units on the real model; this one has no data "
                             "(meta or fake tensors)")
        units = units_from_memory(rep, model, micro=mb)
        if measure_working and no_data:
            raise InputError("measure_working=True runs a real step; this model has no data (meta or "
                             "fake tensors)")
        # the real step runs as the model is: not for another device or under autocast
        here = (device is None or torch.device(device).type == model_device(model).type) and \
            autocast_dtype is None
        if measure_working and not here:
            raise InputError("measure_working=True measures on the model's own device without "
                             "autocast; leave device= and autocast_dtype= unset for it")
        if measure_working or (measure_working is None and not no_data and here
                               and rep.totals.get("gradient_bytes")):
            with gc_paused():
                work = unit_work_bytes(model, units, mb_args, mb_kwargs, loss_fn=loss_fn)
            units = with_work(units, work)
            notes.append(f"working memory: the larger of simulated and measured on {model_device(model)}")
        if by == "latency":
            with gc_paused():
                lat = unit_latencies(model, units, mb_args, mb_kwargs, repeats=latency_repeats,
                                     loss_fn=loss_fn)
            units = with_latencies(units, lat)
        options.update(optimizer=rep.options.get("optimizer"), autocast=rep.options.get("autocast"),
                       device=rep.options.get("device"))
    if count_inputs and isinstance(model_or_report, (Report, MemoryReport)):
        raise InputError("count_inputs=True counts the whole batch's inputs: pass the model and its inputs")
    if count_inputs is None:
        count_inputs = not isinstance(model_or_report, (Report, MemoryReport))
    if return_outputs or count_inputs or target_bytes:
        import dataclasses
        seen: dict[int, int] = {}
        if count_inputs:
            for t in iter_tensors((args, kwargs)):
                seen[id(t)] = t.numel() * t.element_size()
        units = dataclasses.replace(units, kept_outputs=bool(return_outputs),
                                    input_batch_bytes=sum(seen.values()), target_bytes=int(target_bytes))
        options.update(return_outputs=bool(return_outputs))
    if by == "roofline":
        from .analyses.roofline import roofline_for
        from .pipeline.units import roofline_times
        where = torch.device(options.get("device") or "cpu")
        if roofline is None and where.type == "cuda" and not torch.cuda.is_available():
            raise InputError("by='roofline' for a GPU that is not here needs its peaks: roofline='H100' (or "
                             "another name of the built-in table) or (peak_flops, peak_bytes_per_s)")
        roof = roofline_for(roofline or "auto", where, _plan_dtype(units))
        units = with_latencies(units, roofline_times(units, roof))
        notes.append(f"times predicted by a roofline ({roof.name}): {roof.peak_flops / 1e12:.3g} TFLOP/s, "
                     f"{roof.peak_bandwidth / 1e9:.3g} GB/s ({roof.source})")
        options["roofline"] = roof.to_dict()
    return view(build_plan(units, stages=stages, by=by, memory_limit=memory_limit, schedule=schedule,
                      microbatches=microbatches, stages_per_rank=stages_per_rank, options=options,
                      notes=notes, objective=objective, link_bandwidth=link_bandwidth,
                      optimizer_bandwidth=optimizer_bandwidth, cuts=cuts))


def _plan_dtype(units) -> torch.dtype:
    """The floating dtype most of the units' parameters are in (for a roofline's peak)."""
    by = {}
    for u in units.units:
        if u.params:
            by[u.param_bytes // u.params] = by.get(u.param_bytes // u.params, 0) + u.params
    size = max(by, key=by.get) if by else 4
    return {2: torch.bfloat16, 8: torch.float64}.get(size, torch.float32)


@exclusive
def profile(model: nn.Module, *args: Any, warmup: int | str = "auto", repeats: int | str = "auto",
            backward: bool = False,
            device=None, input_size=None, dtypes=None, loss_fn=None, roofline=None, progress: bool = False,
            forward_kwargs: dict | None = None, **kwargs: Any):
    """Time every module call of ``model`` on its own device: forward (and with ``backward=True``
    backward) time per call, inclusive and self, median and quartiles over ``repeats`` after
    ``warmup`` runs. Returns a LatencyReport whose totals put the uninstrumented forward (and
    backward) beside the instrumented one and the sum of self times, so the hooks' overhead shows.

    ``repeats="auto"`` (the default; an int is a fixed count): 6 to 20 repeats, stopping at the first
    at which the distribution-free 95% confidence interval of every median that matters lies within
    +-2% of it for the whole forward (and backward), with hooks and without, and within +-5% for each
    call that takes at least 5% of the whole: about what 20 fixed repeats give on a typical spread
    (analyses/latency.py says why). ``warmup="auto"`` (the default): 1 to 3 runs, more while a run was
    over 2% slower than the next. The report's ``options`` and footer say how many ran and why they
    stopped ("precise", "maximum" or "fixed").

    Forward-only runs are under ``torch.no_grad()`` (as inference runs); with ``backward=True`` each
    repeat runs forward, ``loss_fn(output)`` (default: the output's ``loss`` or its sum) and backward,
    with gradients cleared first. Costs (FLOPs, bytes) come from an analysis on meta copies of the
    weights, so achieved FLOP/s and arithmetic intensity are per call. ``roofline``: a device name
    from the built-in table ("A100", "H100", "H200", ...), "measure" (a short microbenchmark here),
    "auto" (the table for a known GPU, else measured), ``(peak_flops, peak_bytes_per_s)`` or a
    Roofline: each call is then classed compute- or memory-bound with its distance from the roof.
    ``device`` only says where example inputs built from ``input_size`` go; layerscope never moves a
    model. ``progress=True``
    shows a progress bar on stderr. The model is left as it was (weights, buffers, flags, grads, RNG).
    """
    kwargs = forward_inputs(kwargs, forward_kwargs)
    from .analyses.latency import time_calls
    from .analyses.roofline import roofline_for
    from .capture.step import default_loss
    from .render.views import LatencyReport
    from .reports.latency import latency_layers, latency_totals

    check_model(model)
    ProfileOptions(warmup=warmup, repeats=repeats, backward=backward)
    here = model_device(model)
    if here.type == "meta" or is_fake_model(model):
        raise InputError("profile() times real computation; this model has no data (meta or fake "
                         "tensors)")
    if device is not None and torch.device(device).type != here.type:
        raise InputError(f"the model is on {here} but device={str(device)!r} was asked; layerscope never "
                         "moves a model: move it first")
    args = example_inputs(args, kwargs, input_size, dtypes, None, here, "profile")
    try:
        costs = analyze(model, *args, device="meta", mode="same", backward=backward, forward_kwargs=kwargs)
    except LayerscopeError:   # a model that reads values: count on the real tensors
        costs = analyze(model, *args, mode="same", backward=backward, forward_kwargs=kwargs)
    roof = roofline_for(roofline, here, float_dtype(model))

    def run():
        if backward:
            return model(*args, **kwargs)
        with torch.no_grad():
            return model(*args, **kwargs)

    def loss_of(out):
        for p in model.parameters():
            p.grad = None
        return (loss_fn or default_loss)(out)

    guard = StateGuard(model, inputs=(args, kwargs))
    from .analyses.latency import AUTO_MAX, WARMUP_MAX
    bar = ProgressBar((WARMUP_MAX if warmup == "auto" else warmup) + (AUTO_MAX if repeats == "auto" else repeats),
                      "profiling") if progress else None
    ran: dict = {}
    try:
        with gc_paused():
            calls, plain, hooked = time_calls(model, run, loss_of if backward else None, device=here,
                                              warmup=warmup, repeats=repeats,
                                              progress=bar.advance if bar else None, info=ran)
    finally:
        guard.restore()
        if bar:
            bar.close()
    totals = latency_totals(calls, hooked, plain, backward)
    totals["flops"] = costs.totals.flops
    options = {"warmup": ran["warmup"], "repeats": ran["repeats"], "backward": backward, "unit": "repeat"}
    if repeats == "auto" or warmup == "auto":     # how the counts were chosen (a fixed pair: as before)
        options["stopped"] = ran["stopped"]
        options["repeats_rule"] = "auto" if repeats == "auto" else "fixed"
        options["warmup_rule"] = "auto" if warmup == "auto" else "fixed"
        if "worst" in ran:
            options["least_precise"] = {"name": ran["worst"][1], "tolerance_ratio": ran["worst"][0]}
    return LatencyReport(model_name=type(model).__name__, device=str(here),
                         options=options,
                         layers=tuple(latency_layers(calls, costs, backward)), totals=totals,
                         roofline=roof)


