"""`layerscope summary`, `memory` and `profile`: one model, one analysis each."""

from __future__ import annotations

import argparse

import torch

from ..errors import LayerscopeError
from .common import build_spec, emit, live, say, status
from .flags import given


def run_summary(ns: argparse.Namespace) -> int:
    from ..api import analyze
    from ..options import AnalyzeOptions

    if ns.spec.endswith(".onnx"):
        from ..api import analyze_onnx
        from ..errors import InputError
        if ns.input_size or ns.input_ids or ns.set or ns.backward or ns.model_dtype:
            raise InputError("an ONNX file's input shapes come from the file: use `layerscope onnx FILE "
                             "--input NAME=DIMS` to set them")
        with status(f"analysing {ns.spec}", ns):
            return emit(ns, analyze_onnx(ns.spec))
    if ns.spec.endswith(".pt2"):   # issue 22: a torch.export program (torch.export.load, no pickle)
        from ..api import analyze_exported
        from ..errors import InputError
        if ns.input_ids or ns.set or ns.backward:
            raise InputError("a .pt2 program runs forward only on its own inputs: give --input-size (or none "
                             "to use the example inputs stored in it)")
        with status(f"analysing {ns.spec}", ns):
            return emit(ns, analyze_exported(ns.spec, input_size=ns.input_size or None,
                                              dtypes=ns.dtype or None, device=ns.device, causal=ns.causal))
    model, args, kwargs = build_spec(ns, ns.device)
    if isinstance(model, torch.jit.ScriptModule):
        from ..api import analyze_torchscript
        from ..errors import InputError
        if kwargs or ns.backward or ns.device not in (None, "cpu"):
            raise InputError("a TorchScript file is analysed on CPU, forward only, with positional inputs "
                             "(--input-size)")
        with status("analysing", ns):
            rep = analyze_torchscript(model, *args)
        return emit(ns, rep)
    with status("analysing", ns):
        rep = analyze(model, *args, options=AnalyzeOptions(**given(ns, AnalyzeOptions)), forward_kwargs=kwargs)
    return emit(ns, rep)


def run_memory(ns: argparse.Namespace) -> int:
    import functools

    import dataclasses

    from ..api import max_batch_size, memory
    from ..options import MemoryOptions, optimizer_factory
    from ..errors import InputError
    from ..options import iec

    # hf: specs and factories are built where the model will live; a cuda prediction is simulated
    build_on = ns.device if ns.measure else (None if ns.device in (None, "cuda") else ns.device)
    model, args, kwargs = build_spec(ns, build_on)
    optimizer = optimizer_factory(ns.optimizer) if ns.optimizer else None
    if ns.momentum is not None:
        if optimizer is not torch.optim.SGD:
            raise InputError("--momentum applies to --optimizer sgd")
        optimizer = functools.partial(torch.optim.SGD, momentum=ns.momentum)
    # the step from the flags given (cli/flags.py); the batch size, the limit and --measure are memory()'s
    # alone: max_batch_size() searches the batch under the limit
    flags = given(ns, MemoryOptions)
    flags.pop("measure")                          # a switch: not given is False, where memory() takes None
    alone = {k: flags.pop(k, None) for k in ("batch_size", "limit")}
    step = MemoryOptions(**{**flags, "optimizer": optimizer, "training": ns.training})
    with status("simulating the step", ns):
        rep = memory(model, *args, options=dataclasses.replace(step, **alone, measure=ns.measure or None),
                     forward_kwargs=kwargs)
    code = emit(ns, rep)
    if ns.limit and ns.format == "table":
        try:
            # no spinner here: the real steps that check the answer show a progress bar (on a
            # terminal, not with --quiet), and rich draws one live display at a time
            fit = max_batch_size(model, *args, limit=ns.limit, forward_kwargs=kwargs,
                                 options=dataclasses.replace(step, progress=live(ns)))
        except LayerscopeError as e:
            say(f"largest batch that fits: not found ({e})")
            return code
        where = f"largest batch that fits {iec(fit.limit_bytes)}: {fit.batch_size}"
        if fit.capped:     # the search stopped at its ceiling: a larger batch may fit too
            where = f"largest batch that fits {iec(fit.limit_bytes)}: at least {fit.batch_size} (the search's ceiling)"
        peak = f" (predicted peak {iec(fit.peak_bytes)})" if fit.peak_bytes is not None else \
            " (even batch 1 does not fit)"
        real = f" and {fit.real_steps} real step{'s' if fit.real_steps != 1 else ''}" if fit.real_steps else ""
        n = len(fit.samples)
        say(where + peak + f", from {n} simulation{'' if n == 1 else 's'}{real}")
        for note in fit.notes:
            say(f"  note: {note}")
    return code


def run_profile(ns: argparse.Namespace) -> int:
    from ..api import profile
    from ..options import ProfileOptions

    model, args, kwargs = build_spec(ns, ns.device or "cpu")   # real weights: hf: specs build on meta otherwise
    model.eval()
    # the flags given as ProfileOptions' fields (cli/flags.py); --device says where the model was built
    flags = {k: v for k, v in given(ns, ProfileOptions).items() if k != "device"}
    rep = profile(model, *args, options=ProfileOptions(**flags, progress=live(ns)), forward_kwargs=kwargs)
    if ns.trace:
        rep.to_chrome_trace(ns.trace)
    return emit(ns, rep)
