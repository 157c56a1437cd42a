"""``profile()``: every module call of a model timed on its own device, with costs per call."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..capture.repeats import AUTO_MAX, WARMUP_MAX, time_calls
from ..analyses.roofline import roofline_for
from ..capture import StateGuard, model_device
from ..capture.guard import exclusive, gc_paused
from ..capture.prepare import check_model, example_inputs, float_dtype, is_fake_model
from ..capture.loss import default_loss
from ..errors import InputError, LayerscopeError
from ..options import AnalyzeOptions, ProfileOptions, entry_options
from ..progress import ProgressBar
from ..reports.latency import LatencyReport
from ..reports.latency import latency_layers, latency_totals
from ._analyze import analyze_with

__all__ = ["profile"]


@exclusive
def profile(model: nn.Module, *args: Any, warmup: int | str = "auto", repeats: int | str = "auto",
            backward: bool = False, device=None, input_size=None, roofline=None,
            options: ProfileOptions | None = None, forward_kwargs: dict | None = None,
            **kwargs: Any) -> LatencyReport:
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

    Options: the named keywords above, or any other field of ``layerscope.ProfileOptions``
    (``dtypes``, ``loss_fn``, ``progress``) as a keyword, or all of them in
    ``options=ProfileOptions(...)``; an option given both in ``options=`` and as a keyword (a named one
    away from its default) is an InputError. A forward argument named like an option goes in
    ``forward_kwargs``.
    """
    opts, kwargs = entry_options(ProfileOptions, options, kwargs, forward_kwargs, warmup=warmup, repeats=repeats,
                                 backward=backward, device=device, input_size=input_size, roofline=roofline)
    here = _real_device(model, opts)
    args = example_inputs(args, kwargs, opts.input_size, opts.dtypes, None, here, "profile")
    costs = _costs(model, args, kwargs, opts.backward)
    roof = roofline_for(opts.roofline, here, float_dtype(model))
    calls, plain, hooked, ran = _time_model(model, args, kwargs, opts, here)
    totals = latency_totals(calls, hooked, plain, opts.backward)
    totals["flops"] = costs.totals.flops
    return LatencyReport(model_name=type(model).__name__, device=str(here),
                         options=_run_echo(ran, opts),
                         layers=tuple(latency_layers(calls, costs, opts.backward)), totals=totals,
                         roofline=roof)


def _real_device(model: nn.Module, opts: ProfileOptions) -> torch.device:
    """The model's device, once it is checked to hold real data and to be where ``device=`` asks."""
    check_model(model)
    here = model_device(model)
    if here.type == "meta" or is_fake_model(model):
        raise InputError("profile() times real computation; this model has no data (meta or fake "
                         "tensors)")
    if opts.device is not None and torch.device(opts.device).type != here.type:
        raise InputError(f"the model is on {here} but device={str(opts.device)!r} was asked; layerscope never "
                         "moves a model: move it first")
    return here


def _costs(model: nn.Module, args: tuple, kwargs: dict, backward: bool):
    """Each call's FLOPs and bytes: an analysis on meta copies of the weights, or on the real tensors
    for a model that reads values."""
    try:
        return analyze_with(model, args, kwargs, AnalyzeOptions(device="meta", mode="same", backward=backward))
    except LayerscopeError:   # a model that reads values: count on the real tensors
        return analyze_with(model, args, kwargs, AnalyzeOptions(mode="same", backward=backward))


def _time_model(model: nn.Module, args: tuple, kwargs: dict, opts: ProfileOptions, here: torch.device):
    """The timed runs (capture/repeats.py): (calls, plain, hooked, what ran), the model restored after."""
    warmup, repeats, backward, loss_fn = opts.warmup, opts.repeats, opts.backward, opts.loss_fn

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
    bar = ProgressBar((WARMUP_MAX if warmup == "auto" else warmup) + (AUTO_MAX if repeats == "auto" else repeats),
                      "profiling") if opts.progress else None
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
    return calls, plain, hooked, ran


def _run_echo(ran: dict, opts: ProfileOptions) -> dict:
    """The report's options: how many warm-up runs and repeats ran, and (counts chosen) why they stopped."""
    warmup, repeats = opts.warmup, opts.repeats
    options = {"warmup": ran["warmup"], "repeats": ran["repeats"], "backward": opts.backward, "unit": "repeat"}
    if repeats == "auto" or warmup == "auto":     # how the counts were chosen (a fixed pair: as before)
        options["stopped"] = ran["stopped"]
        options["repeats_rule"] = "auto" if repeats == "auto" else "fixed"
        options["warmup_rule"] = "auto" if warmup == "auto" else "fixed"
        if "worst" in ran:
            options["least_precise"] = {"name": ran["worst"][1], "tolerance_ratio": ran["worst"][0]}
    return options
