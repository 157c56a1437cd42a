"""DeepSpeed's flops profiler (``deepspeed.profiling.flops_profiler``) with layerscope's numbers.

    from layerscope.compat.deepspeed import get_model_profile, FlopsProfiler
    flops, macs, params = get_model_profile(model, input_shape=(2, 3, 32, 32))   # "1.2 M", "0.6 MMACs", "1.1 K"

    prof = FlopsProfiler(model)                  # the training-loop form
    prof.start_profile()
    loss = model(batch)
    flops = prof.get_total_flops(as_string=True)
    prof.print_model_profile(profile_step=1)
    prof.end_profile()

Same names, defaults, return values and printed sections as DeepSpeed. Where the numbers differ
(docs/compat.md): MACs and FLOPs come from the aten ops that ran (DeepSpeed patches
``torch.nn.functional`` and misses whatever else runs: an LSTM's matmuls, ``@``, SDPA kernels);
FLOPs are 2 x MACs plus every other op's arithmetic by layerscope's per-op table (DeepSpeed: its own
table, e.g. no FLOPs for a bias inside ``F.linear``); latencies are layerscope's hooked forward
times (``get_model_profile``: one timed run after ``warm_up`` runs, as DeepSpeed); "params of
model" is params per GPU x mp_size with mp_size 1 (DeepSpeed prints 0 without an engine). The model is never patched: no
``__flops__`` attributes, no monkey-patched functionals, and it comes out as it went in.
"""

from __future__ import annotations

import torch
from torch import nn

from ..errors import InputError
from ..render.deepspeed import (DEFAULT_PRECISION, ModuleProfile, aggregated_profile, module_params,  # noqa: F401
                                to_output_file, bytes_to_string, duration_to_string, flops_to_string,
                                macs_to_string, model_profile_text, number_to_string, params_to_string)

__all__ = ["FlopsProfiler", "get_model_profile", "number_to_string", "macs_to_string", "flops_to_string",
           "params_to_string", "duration_to_string", "bytes_to_string", "ModuleProfile", "model_profile_text"]


class FlopsProfiler:
    """DeepSpeed's FlopsProfiler(model, ds_engine=None, recompute_fwd_factor=0.0) over
    ``layerscope.Profiler``: start_profile / stop_profile / reset_profile / end_profile,
    get_total_flops / macs / params / duration (``as_string``), print_model_profile,
    print_model_aggregated_profile. A step is one top-level forward."""

    def __init__(self, model: nn.Module, ds_engine=None, recompute_fwd_factor: float = 0.0) -> None:
        from ..profiler import Profiler
        if ds_engine is not None:
            raise InputError("ds_engine is not supported: layerscope profiles one process's model")
        self.model, self.ds_engine, self.recompute_fwd_factor = model, ds_engine, recompute_fwd_factor
        self._prof = Profiler(model, step_on="forward", warmup_steps=0)
        self.started = False
        self.flops = self.macs = self.params = None

    def start_profile(self, ignore_list=None) -> None:
        if ignore_list:
            raise InputError("ignore_list is not supported: layerscope counts every module (coverage "
                             "lists what it cannot count)")
        self.reset_profile()
        self._prof.start_profile()
        self.started = True

    def stop_profile(self) -> None:
        self._prof.stop_profile()

    def reset_profile(self) -> None:
        running = self._prof.running
        self._prof.end_profile()
        if running:
            self._prof.start_profile()

    def end_profile(self) -> None:
        if not self.started:
            return
        self._prof.end_profile()
        self.started = False

    def get_total_flops(self, as_string: bool = False):
        return self._prof.get_total_flops(as_string)

    def get_total_macs(self, as_string: bool = False):
        return self._prof.get_total_macs(as_string)

    def get_total_params(self, as_string: bool = False):
        return self._prof.get_total_params(as_string)

    def get_total_duration(self, as_string: bool = False):
        return self._prof.get_total_duration(as_string)

    def print_model_profile(self, profile_step=1, module_depth=-1, top_modules=1, detailed=True,
                            output_file=None) -> None:
        if not self.started:
            return
        self.flops, self.macs, self.params = (self.get_total_flops(), self.get_total_macs(),
                                              self.get_total_params())
        self._prof.print_model_profile(profile_step, module_depth, top_modules, detailed, output_file)

    def print_model_aggregated_profile(self, module_depth=-1, top_modules=1) -> None:
        print(aggregated_profile(self._prof._module_profile(), module_depth, top_modules), end="")


def get_model_profile(model: nn.Module, input_shape=None, args=[], kwargs={}, print_profile=True,  # noqa: B006
                      detailed=True, module_depth=-1, top_modules=1, warm_up=1, as_string=True,
                      output_file=None, ignore_modules=None, mode="forward"):
    """DeepSpeed's get_model_profile: ``warm_up`` forwards, then one profiled forward in eval mode
    (the model's flags are restored afterwards; DeepSpeed leaves it in eval). Returns
    ``(flops, macs, params)``, as strings ("1.2 G", "0.6 GMACs", "3.4 M") with ``as_string``."""
    from ..api import analyze, profile
    from ..capture.prepare import check_model
    check_model(model)
    if mode != "forward":
        raise InputError(f"mode={mode!r} is not supported: only 'forward' (profile model.generate "
                         "by analysing one forward step)")
    if ignore_modules:
        raise InputError("ignore_modules is not supported: layerscope counts every module")
    if not isinstance(warm_up, int) or warm_up < 0:
        raise InputError(f"warm_up must be an int >= 0, got {warm_up!r}")
    args, kwargs = list(args or []), dict(kwargs or {})
    if input_shape is not None:
        if not isinstance(input_shape, tuple) or not input_shape:
            raise InputError(f"input_shape must be a non-empty tuple, got {input_shape!r}")
        if args:
            raise InputError("give input_shape or args, not both")
        dtype = next((p.dtype for p in model.parameters()), torch.float32)
        args = [torch.zeros(input_shape, dtype=dtype, device=_device(model))]
    if not args and not kwargs:
        raise InputError("args and/or kwargs must be specified if input_shape is None")
    flags = [(m, m.training) for m in model.modules()]
    try:
        model.eval()
        meta = _device(model).type == "meta"
        costs = analyze(model, *args, mode="same", forward_kwargs=kwargs)
        latency = None if meta else profile(model, *args, warmup=warm_up, repeats=1, forward_kwargs=kwargs)
    finally:
        for m, t in flags:
            m.training = t
    prof = ModuleProfile(model, costs, latency)
    if print_profile:
        text = model_profile_text(prof, warm_up, module_depth, top_modules, detailed)
        with to_output_file(output_file) as f:
            f.write(text)
    flops, macs, params = prof.total_flops, prof.total_macs, prof.total_params
    if as_string:
        return number_to_string(flops), macs_to_string(macs), params_to_string(params)
    return flops, macs, params


def _device(model: nn.Module) -> torch.device:
    from ..capture import model_device
    return model_device(model)
