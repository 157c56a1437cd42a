"""DeepSpeed's flops profiler (``deepspeed.profiling.flops_profiler``) with layerscope's numbers.

    from layerscope.compat.deepspeed import get_model_profile, FlopsProfiler
    flops, macs, params = get_model_profile(model, input_shape=(2, 3, 32, 32))   # "1.2 M", "0.6 MMACs", "1.1 K"

    prof = FlopsProfiler(model)                  # the training-loop form
    prof.start_profile()
    loss = model(batch)
    flops = prof.get_total_flops(as_string=True)
    prof.print_model_profile(profile_step=1)
    prof.end_profile()

Same names, defaults, return values and printed sections as DeepSpeed; as there, FlopsProfiler's
getters add up every forward since ``start_profile``, and a ``ds_engine`` (or an object with its
attributes, given or set later) has its world sizes printed. Where the numbers differ
(docs/compat.md): MACs and FLOPs come from the aten ops that ran (DeepSpeed patches
``torch.nn.functional`` and misses whatever else runs: an LSTM's matmuls, ``@``, SDPA kernels);
FLOPs are 2 x MACs plus every other op's arithmetic by layerscope's per-op table (DeepSpeed: its own
table, e.g. no FLOPs for a bias inside ``F.linear``, none for SDPA's scale and softmax); latencies
are layerscope's hooked forward times (``get_model_profile``: one timed run after ``warm_up`` runs,
as DeepSpeed); "params of model" is params per GPU x mp_size, mp_size 1 without an engine (DeepSpeed
prints 0 then). The model is never patched: no ``__flops__`` attributes, no monkey-patched
functionals, and it comes out as it went in.
"""

from __future__ import annotations

import torch
from torch import nn

from ..capture.counter import ForwardCounter
from ..errors import InputError
from ..render.deepspeed import (DEFAULT_PRECISION, ModuleProfile, aggregated_profile, module_params,  # noqa: F401
                                to_output_file, bytes_to_string, duration_to_string, flops_to_string,
                                macs_to_string, model_profile_text, number_to_string, params_to_string)

__all__ = ["FlopsProfiler", "get_model_profile", "number_to_string", "macs_to_string", "flops_to_string",
           "params_to_string", "duration_to_string", "bytes_to_string", "ModuleProfile", "model_profile_text"]


class FlopsProfiler:
    """DeepSpeed's FlopsProfiler(model, ds_engine=None, recompute_fwd_factor=0.0): start_profile /
    stop_profile / reset_profile / end_profile, get_total_flops / macs / params / duration
    (``as_string``), print_model_profile, print_model_aggregated_profile.

    As DeepSpeed's, it counts during the model's own forwards since start_profile (or reset_profile),
    each added up: every aten op the forward runs is priced by layerscope's formulas as it runs (a
    dispatch mode entered for the outermost call of the model, in the calling thread) and added to the
    innermost module call running; each module call is timed by hooks. Nothing is run again, nothing
    of the inputs is kept, the forward runs as written (its mode, values, gradients). A forward run by
    one of layerscope's own analyses is not counted, nor a call of the model inside its own forward
    twice. An op without a formula is named in the printed profile (the FLOPs leave it out).
    stop_profile stops counting and keeps the counts; end_profile forgets them. ``ds_engine`` (here or
    set as the attribute later; a DeepSpeed engine or any object with its attributes): its world sizes,
    batch size and timers are printed as DeepSpeed prints them."""

    def __init__(self, model: nn.Module, ds_engine=None, recompute_fwd_factor: float = 0.0) -> None:
        if not isinstance(model, nn.Module) or isinstance(model, torch.jit.ScriptModule):
            raise InputError("FlopsProfiler profiles a torch.nn.Module (a TorchScript module takes no hooks), "
                             f"got {type(model).__name__}")
        self.model, self.ds_engine, self.recompute_fwd_factor = model, ds_engine, recompute_fwd_factor
        self._counter = ForwardCounter(model)   # the counting: hooks, a per-thread call stack, OpCounter
        self.started = False
        self.flops = self.macs = self.params = None

    def start_profile(self, ignore_list=None) -> None:
        if ignore_list:
            raise InputError("ignore_list is not supported: layerscope counts every module (coverage "
                             "lists what it cannot count)")
        self.reset_profile()
        self._counter.attach()
        self.started = True

    def stop_profile(self) -> None:
        self._counter.detach()

    def reset_profile(self) -> None:
        self._counter.reset()

    def end_profile(self) -> None:
        if not self.started:
            return
        self.stop_profile()
        self.reset_profile()
        self.started = False

    def get_total_flops(self, as_string: bool = False):
        n = self._counter.flops
        return number_to_string(n) if as_string else n

    def get_total_macs(self, as_string: bool = False):
        n = self._counter.macs
        return macs_to_string(n) if as_string else n

    def get_total_params(self, as_string: bool = False):
        n = module_params(self.model)
        return params_to_string(n) if as_string else n

    def get_total_duration(self, as_string: bool = False):
        n = self._counter.seconds.get("", 0.0)
        return duration_to_string(n) if as_string else n

    def print_model_profile(self, profile_step=1, module_depth=-1, top_modules=1, detailed=True,
                            output_file=None) -> None:
        if not self.started:
            return
        prof = self._module_profile()
        self.flops, self.macs, self.params = prof.total_flops, prof.total_macs, prof.total_params
        text = model_profile_text(prof, profile_step, module_depth, top_modules, detailed, engine=self.ds_engine,
                                  recompute_fwd_factor=self.recompute_fwd_factor)
        with to_output_file(output_file) as f:
            f.write(text)

    def print_model_aggregated_profile(self, module_depth=-1, top_modules=1) -> None:
        if not self.started:
            print("no __flops__ attribute in the model, call this function after start_profile and before "
                  "end_profile")
            return
        print(aggregated_profile(self._module_profile(), module_depth, top_modules), end="")

    def _module_profile(self) -> ModuleProfile:
        c = self._counter
        return ModuleProfile(self.model, None, durations=c.seconds, own={k: tuple(v) for k, v in c.own.items()},
                             uncounted=c.uncounted)


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
    # eval mode on a copy of the module tree (capture/shadow.py): another thread calling the model
    # meanwhile keeps its own mode (issue 58)
    from ..capture.shadow import shadow_of
    work = shadow_of(model)
    flags = [(m, m.training) for m in work.modules()]
    try:
        work.eval()
        meta = _device(work).type == "meta"
        costs = analyze(work, *args, mode="same", forward_kwargs=kwargs)
        latency = None if meta else profile(work, *args, warmup=warm_up, repeats=1, forward_kwargs=kwargs)
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
