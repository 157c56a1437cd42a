"""Entry points for models given as graphs: a torch.export program and a TorchScript module, each run
node by node under the same op recorder as ``analyze()`` (formats/ turns the graph into records)."""

from __future__ import annotations

from typing import Any

import torch

from ..capture.guard import exclusive, gc_paused
from ..capture.inputs import make_inputs
from ..costs import CostOptions
from ..errors import InputError
from ..formats.exported import exported_trace, load_exported
from ..formats.torchscript import load_torchscript, torchscript_trace
from ..options import AnalyzeOptions, entry_options
from ..reports.summary import Report

__all__ = ["analyze_exported", "analyze_exported_with", "analyze_torchscript"]


@exclusive
def analyze_exported(program, *args: Any, input_size=None, dtypes=None, device=None, causal: str = "dense",
                     options: AnalyzeOptions | None = None, **kwargs: Any) -> Report:
    """Analyse a torch.export program (an ``ExportedProgram``, or a ``.pt2`` path loaded with
    ``torch.export.load``, which runs no pickled code) into the same Report as ``analyze()`` of the
    eager model: its ATen graph runs node by node under the same op recorder, and each node's
    ``nn_module_stack`` opens and closes the module calls, so layers keep the original module paths.
    Inputs: as given (``input_size`` builds them), else the example inputs stored in the program; a
    symbolic dim they do not settle is named in an error, never sized 0. The graph runs as exported
    (its train/eval behaviour fixed at export), forward only, on CPU or ``device="meta"``.
    ``options=AnalyzeOptions(...)`` may give these four options instead (its mode does not apply;
    backward, batch_dim and costs do not either); keywords other than these four go to the graph."""
    opts, kwargs = entry_options(AnalyzeOptions, options, kwargs, take=False, input_size=input_size,
                                 dtypes=dtypes, device=device, causal=causal)
    return analyze_exported_with(program, args, kwargs, opts)


def analyze_exported_with(program, args: tuple, kwargs: dict, opts: AnalyzeOptions) -> Report:
    """``analyze_exported()`` once its options are an object (``analyze()`` routes programs here)."""
    if opts.backward or opts.batch_dim is not None or opts.costs is not None:
        raise InputError("an exported program is analysed forward only, with its own inputs and the default "
                         "cost registry: backward, batch_dim and costs do not apply")
    ep = load_exported(program)
    if opts.input_size is not None:
        if args or kwargs:
            raise InputError("give example inputs or input_size, not both")
        args = tuple(make_inputs(opts.input_size, opts.dtypes, None, torch.device("cpu")))
    elif opts.dtypes is not None:
        raise InputError("dtypes only applies together with input_size")
    with gc_paused():
        return Report(exported_trace(ep, tuple(args), kwargs, device=opts.device,
                                     options=CostOptions(causal=opts.causal)))


@exclusive
def analyze_torchscript(model, *example_inputs: Any, input_size=None, dtypes=None,
                        options: AnalyzeOptions | None = None) -> Report:
    """Analyse a TorchScript module (a path loaded with ``torch.jit.load``, never pickle, or a
    ScriptModule) on example inputs (or ``input_size``): its inlined forward graph runs node by node
    under the same op recorder as ``analyze()``, so layers, parameters, shapes and costs come out
    the same. The module is run as it is (its train/eval flags), on CPU, without gradients.
    ``options=AnalyzeOptions(input_size=..., dtypes=...)`` may give the two options instead."""
    opts, _ = entry_options(AnalyzeOptions, options, {}, take=False, input_size=input_size, dtypes=dtypes)
    if opts != AnalyzeOptions(input_size=opts.input_size, dtypes=opts.dtypes):
        raise InputError("a TorchScript module runs as it is, forward only on cpu: of AnalyzeOptions only "
                         "input_size and dtypes apply")
    module = load_torchscript(model)
    if opts.input_size is not None:
        if example_inputs:
            raise InputError("give example inputs or input_size, not both")
        example_inputs = tuple(make_inputs(opts.input_size, opts.dtypes, None, torch.device("cpu")))
    if not example_inputs:
        raise InputError("a TorchScript model needs example inputs (or input_size) to analyse")
    with gc_paused():
        return Report(torchscript_trace(module, tuple(example_inputs)), module)
