"""``analyze()`` and ``activations()``: one eager forward (and backward) under a Session, and the front
door that routes exported, compiled and scripted models to their graph paths (api/exported.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn

from ..capture import capture, model_device
from ..capture.attention import router_for
from ..capture.guard import exclusive, gc_paused
from ..capture.inputs import iter_tensors, make_inputs
from ..capture.known import KnownIndexError, KnownValues
from ..capture.notes import Note
from ..capture.prepare import check_model, prepare_inputs
from ..costs import CostOptions, CostRegistry
from ..errors import ForwardError, InputError
from ..formats.exported import compiled_original, graph_module_trace, is_exported_module
from ..options import AnalyzeOptions, entry_options
from ..reports.notes import worded
from ..reports.summary import Report
from ..trace import FORWARD
from ._exported import analyze_exported_with, analyze_torchscript

__all__ = ["analyze", "activations"]


@exclusive(paused=True)
def analyze(model: nn.Module, *args: Any, input_size=None, dtypes=None, device=None, mode: str = "eval",
            backward: bool = False, options: AnalyzeOptions | None = None, forward_kwargs: dict | None = None,
            **kwargs: Any) -> Report:
    """Analyse one forward (and, with ``backward=True``, one backward) of ``model``.

    Args and kwargs pass to ``model.forward`` as they are (dicts, lists, token ids, ...); or give
    ``input_size`` (with ``dtypes`` and ``batch_dim``) to build example inputs. ``device='meta'`` runs
    a real model on meta copies of its weights, so nothing is computed. ``mode`` is "eval", "train"
    or "same" (leave the model's flags as they are); the model's own state is restored afterwards.
    ``causal="unmasked"`` counts only the unmasked part of causal attention. ``costs`` is a
    ``layerscope.costs.CostRegistry`` to price ops with instead of the default one (eager modules only;
    ``default_registry().copy()`` then ``register``/``override``); an op it has no formula for is
    uncounted in coverage. ``gpu`` (a name of the built-in table, ``layerscope.GPUS``, or
    ``layerscope.gpu("H100", capability=(8, 0))``) prices ``scaled_dot_product_attention`` as the kernel
    torch's CUDA rules pick on that GPU for each call's dtype, shapes and mask (flash, memory-efficient,
    cuDNN or math; the run goes to meta); ``attention`` forces one ("math", "flash", "efficient",
    "cudnn"). Without either, a meta run prices SDPA as the math kernel it runs; the report's notes
    say which kernel was priced.

    Options: the named keywords above, or any other field of ``layerscope.AnalyzeOptions``
    (``batch_dim``, ``causal``, ``costs``, ``gpu``, ``attention``) as a keyword, or all of them in ``options=AnalyzeOptions(...)``;
    an option given both in ``options=`` and as a keyword (a named one away from its default) is an
    InputError. A forward argument named like an option (``mode``, ``device``, ``costs``, ...) goes in
    ``forward_kwargs={"mode": ...}``: keywords an option takes are options.
    """
    opts, kwargs = entry_options(AnalyzeOptions, options, kwargs, forward_kwargs, input_size=input_size,
                                 dtypes=dtypes, device=device, mode=mode, backward=backward)
    return analyze_with(model, args, kwargs, opts)


def analyze_with(model, args: tuple, kwargs: dict, opts: AnalyzeOptions) -> Report:
    """analyze()'s run for one options object, below the entry point: what profile() calls for its
    costs (no entry point calls another; the caller holds the model exclusively, as analyze() does)."""
    if opts.costs is not None:
        _check_costs(model, opts.costs)
    if (opts.gpu is not None or opts.attention != "auto") and (
            isinstance(model, (torch.export.ExportedProgram, torch.jit.ScriptModule)) or is_exported_module(model)):
        raise InputError("gpu= and attention= apply to an eager nn.Module; an exported or TorchScript graph "
                         "prices the attention ops it holds")
    # torch.export / torch.compile front doors (issue 22): an ExportedProgram or ep.module() runs its
    # graph (formats/exported.py); a compiled module is analysed as its original module, with a note
    routed = _route(model, args, kwargs, opts)
    if routed is not None:
        return routed
    check_model(model)
    if isinstance(model, torch.jit.ScriptModule):
        return _analyze_script(model, args, kwargs, opts)
    if (opts.gpu is not None or opts.attention != "auto") and \
            (opts.device is None or torch.device(opts.device).type == "cuda"):
        # priced for a GPU (the one named, not one that may be here): a run without values
        opts = dataclasses.replace(opts, device="meta")
    given = (args, kwargs)
    args, kwargs, on_meta = prepare_inputs(model, args, kwargs, opts.input_size, opts.dtypes, opts.batch_dim,
                                           opts.device)
    known = None
    no_values = on_meta or model_device(model).type == "meta"
    if no_values:
        # the values of small integer inputs (ids, lengths, masks) go along (capture/known.py)
        known = KnownValues()
        known.seed_pairs(iter_tensors((args, kwargs)), iter_tensors(given))
    router = router_for(opts.gpu, opts.attention, simulated=no_values, cuda_target=False)
    with gc_paused():
        try:
            trace, _ = capture(model, args, kwargs, mode=opts.mode, backward=opts.backward, on_meta=on_meta,
                               options=CostOptions(causal=opts.causal, registry=opts.costs), known=known,
                               attention=router)
        except ForwardError as e:
            if not no_values or isinstance(e.__cause__, KnownIndexError):
                raise
            raise _meta_hint(e) from e.__cause__
        rep = Report(trace, model)
        notes = known.notes() if known is not None else []
        notes += router.notes() if router is not None else _math_sdpa_note(trace) if no_values else []
        for note in worded(notes):    # a trace's options hold plain text (its JSON echoes them)
            rep = _noted(rep, note)
        return rep


def _math_sdpa_note(trace) -> list[Note]:
    """A meta run without a GPU named runs SDPA as the math kernel (the only op that kernel's softmax
    is, ``_safe_softmax``, marks each call): say so, and how to price a GPU's kernel instead."""
    n = sum(1 for op in trace.ops if op.op == "aten._safe_softmax" and op.phase == FORWARD)
    if not n:
        return []
    return [Note("attention-math-on-meta", {"calls": n})]


def _check_costs(model, costs) -> None:
    """analyze(costs=...): a CostRegistry, for an eager module (the exported, compiled and TorchScript
    front doors price ops with the default registry)."""
    if not isinstance(costs, CostRegistry):
        raise InputError(f"costs must be a layerscope.costs.CostRegistry (default_registry().copy()), got "
                         f"{type(costs).__name__}")
    if (isinstance(model, (torch.export.ExportedProgram, torch.jit.ScriptModule))
            or compiled_original(model) is not None or is_exported_module(model)):
        raise InputError("costs= applies to an eager nn.Module; an exported, compiled or TorchScript model "
                         "is priced with the default cost registry")


def _noted(report: Report, note: str) -> Report:
    """The same report with ``note`` added to its trace's notes (shown as ``report.notes`` and in JSON)."""
    opts = dict(report.trace.options)
    opts["notes"] = tuple(opts.get("notes", ())) + (note,)
    model = report._model() if report._model is not None else None
    return Report(dataclasses.replace(report.trace, options=opts), model, graph=report.graph)


def _route(model, args: tuple, kwargs: dict, opts: AnalyzeOptions) -> Report | None:
    """``analyze()``'s front door for exported and compiled models; None for any other model.

    * ExportedProgram: analyze_exported (forward only; the graph's train/eval behaviour was fixed at
      export, so ``mode`` does not apply).
    * torch.compile'd module (OptimizedModule): ``analyze`` of its ``_orig_mod``, which the compiled
      module runs; a note says so. The compiled kernels themselves are not what is counted.
    * ``ep.module()`` (its train()/eval() raise): its graph runs as exported (mode "same"), with the
      module calls of each node's nn_module_stack; ``backward=True`` runs it as a module with
      mode="same" instead (every op in the root layer, since the graph calls no submodule).
    """
    if isinstance(model, torch.export.ExportedProgram):
        if opts.backward:
            raise InputError("an exported program is analysed forward only: analyse the eager model "
                             "for backward=True")
        if opts.batch_dim is not None:
            raise InputError("batch_dim does not apply to an exported program")
        return analyze_exported_with(model, args, kwargs, opts)
    orig = compiled_original(model)
    if orig is not None:
        rep = analyze(orig, *args, options=opts, forward_kwargs=kwargs)
        return _noted(rep, f"torch.compile'd model: analysed its original module ({type(orig).__name__}, "
                           "_orig_mod), whose eager ops are what is counted")
    if not is_exported_module(model) or opts.mode == "same" and opts.backward:
        return None
    if opts.mode == "train":
        raise InputError("the module of an exported program (ep.module()) cannot be switched to train "
                         "mode: it runs as it was exported; pass mode='same'")
    if opts.backward:
        rep = analyze(model, *args, options=dataclasses.replace(opts, mode="same"), forward_kwargs=kwargs)
        return _noted(rep, "an exported program's module (ep.module()) runs as exported (mode='same'); "
                           "with backward=True its ops are all in the root layer (the graph calls no "
                           "submodule)")
    if opts.device not in (None, "cpu"):
        raise InputError("the module of an exported program is analysed on CPU; for device='meta' pass "
                         "the ExportedProgram itself")
    if opts.input_size is not None:
        if args:
            raise InputError("give either input_size or example inputs, not both")
        args = tuple(make_inputs(opts.input_size, opts.dtypes, opts.batch_dim, torch.device("cpu")))
    if not args and not kwargs:
        raise InputError("no example inputs: pass them as arguments (analyze(model, x)) or give input_size")
    rep = Report(graph_module_trace(model, tuple(args), dict(kwargs), options=CostOptions(causal=opts.causal)),
                 model)
    if opts.mode == "eval":
        rep = _noted(rep, "an exported program's module (ep.module()) runs as exported: mode='same' "
                          "(its train/eval behaviour was fixed at export)")
    return rep


def _analyze_script(model, args, kwargs, opts: AnalyzeOptions) -> Report:
    """A whole ScriptModule given to analyze(): its hooks never run inside TorchScript, so it goes
    the TorchScript path (its graph run node by node), which analyses one forward on cpu."""
    device, causal = opts.device, opts.causal
    why = ("backward=True" if opts.backward else "keyword inputs" if kwargs else
           f"device={device!r}" if device is not None and torch.device(device).type != "cpu" else
           "batch_dim" if opts.batch_dim is not None else f"causal={causal!r}" if causal != "dense" else None)
    if why:
        raise InputError(f"a TorchScript module is analysed through its graph (analyze_torchscript): one "
                         f"forward on cpu with positional inputs; {why} is not supported for it")
    flags = [(m, m.training) for m in model.modules()]
    try:
        if opts.mode != "same":
            model.train(opts.mode == "train")
        return analyze_torchscript(model, *args, input_size=opts.input_size, dtypes=opts.dtypes)
    finally:
        for m, training in flags:
            m.training = training


def _meta_hint(err: ForwardError) -> ForwardError:
    return ForwardError(f"{err} -- on meta, tensors have shapes but no values: code that reads values "
                        "(routing tokens to experts by index, masks built with nonzero or .tolist()) "
                        "cannot run there; analyse the model on cpu instead",
                        path=err.path, module_type=err.module_type, input_shapes=err.input_shapes)


@exclusive
def activations(model: nn.Module, *args: Any, select=None, mode: str = "eval",
                options: AnalyzeOptions | None = None, forward_kwargs: dict | None = None,
                **kwargs: Any) -> dict[str, Any]:
    """Detached outputs of the selected layers for one no-grad forward.

    ``select``: module classes and/or fnmatch patterns on the module path. Keys are module paths; a
    module called more than once adds keys ``path[1]``, ``path[2]``, ... for its later calls.
    ``options=AnalyzeOptions(mode=...)`` may give the mode instead (only the mode applies here); every
    other keyword goes to the forward.
    """
    from ..capture.activations import collect_activations
    opts, kwargs = entry_options(AnalyzeOptions, options, kwargs, forward_kwargs, take=False, mode=mode)
    if opts != AnalyzeOptions(mode=opts.mode):
        raise InputError("activations() takes only mode from AnalyzeOptions; pass the inputs themselves")
    check_model(model)
    return collect_activations(model, args, kwargs, select, opts.mode)
