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

from ..capture import hooks
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

    As DeepSpeed's, the getters cover every forward of the model since start_profile (or
    reset_profile): MACs and FLOPs added up over the forwards (each forward analysed by
    ``layerscope.analyze`` on meta copies of its inputs; forwards with the same input shapes once),
    the duration the sum of their times (``layerscope.Profiler``'s hooks, a step per forward).
    stop_profile stops counting and keeps the counts; end_profile forgets them. ``ds_engine``
    (here or set as the attribute later; a DeepSpeed engine or any object with its attributes):
    its world sizes, batch size and timers are printed as DeepSpeed prints them."""

    def __init__(self, model: nn.Module, ds_engine=None, recompute_fwd_factor: float = 0.0) -> None:
        from ..profiler import Profiler
        self.model, self.ds_engine, self.recompute_fwd_factor = model, ds_engine, recompute_fwd_factor
        self._prof = Profiler(model, step_on="forward", warmup_steps=0, costs=False)
        self._handles: list = []
        self._forwards: list[tuple] = []      # (key, meta args, meta kwargs, training) per forward
        self._reports: dict = {}              # key -> that forward's Report
        self.started = False
        self.flops = self.macs = self.params = None

    def start_profile(self, ignore_list=None) -> None:
        if ignore_list:
            raise InputError("ignore_list is not supported: layerscope counts every module (coverage "
                             "lists what it cannot count)")
        self.reset_profile()
        self._hook()
        self._prof.start_profile()
        self.started = True

    def stop_profile(self) -> None:
        self._prof.stop_profile()
        hooks.remove_all(self._handles)

    def reset_profile(self) -> None:
        self._forwards, self._reports = [], {}
        running = self._prof.running
        self._prof.end_profile()
        if running:
            self._prof.start_profile()

    def end_profile(self) -> None:
        if not self.started:
            return
        self.stop_profile()
        self.reset_profile()
        self.started = False

    def get_total_flops(self, as_string: bool = False):
        n = sum(r.totals.flops for r in self._costs())
        return number_to_string(n) if as_string else n

    def get_total_macs(self, as_string: bool = False):
        n = sum(r.totals.macs for r in self._costs())
        return macs_to_string(n) if as_string else n

    def get_total_params(self, as_string: bool = False):
        n = module_params(self.model)
        return params_to_string(n) if as_string else n

    def get_total_duration(self, as_string: bool = False):
        n = self._durations().get("", 0.0)
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

    # ---- the forwards since start_profile -------------------------------------------------------
    def _hook(self) -> None:
        if not self._handles:
            self._handles.append(hooks.forward_pre_hook(self.model, self._record, with_kwargs=True))

    def _record(self, module, args, kwargs) -> None:
        from ..capture.inputs import meta_copies
        example = (meta_copies(args), meta_copies(kwargs), module.training)
        self._forwards.append((_signature(example), *example))

    def _sync(self):
        """Hooks off (the profiler's open step closed, so that the forward just run is in its steps)
        while the getters read or analyse; back on after, where they were."""
        hooked, running = bool(self._handles), self._prof.running
        self.stop_profile()
        return hooked, running

    def _resume(self, hooked: bool, running: bool) -> None:
        if hooked:
            self._hook()
        if running:
            self._prof.start_profile()

    def _costs(self) -> list:
        """Each forward's Report, in order (one analysis per distinct input signature)."""
        from ..api import analyze
        state = self._sync()
        try:
            for key, args, kwargs, training in self._forwards:
                if key not in self._reports:
                    self._reports[key] = analyze(self.model, *args, device="meta", forward_kwargs=kwargs,
                                                 mode="train" if training else "eval")
        finally:
            self._resume(*state)
        return [self._reports[f[0]] for f in self._forwards]

    def _durations(self) -> dict[str, float]:
        """Seconds by module path, summed over its calls in every forward (DeepSpeed's __duration__)."""
        state = self._sync()
        try:
            out: dict[str, float] = {}
            for calls in self._prof.step_calls():       # a step per forward (step_on="forward")
                for c in calls:
                    out[c.path] = out.get(c.path, 0.0) + sum(c.forward)
            return out
        finally:
            self._resume(*state)

    def _module_profile(self) -> ModuleProfile:
        return ModuleProfile(self.model, self._costs(), durations=self._durations())


_PLAIN = (type(None), bool, int, float, complex, str, torch.dtype, torch.device, torch.layout, torch.memory_format)


def _signature(obj):
    """A key equal for two forwards whose inputs give the same analysis (tensors by shape, dtype and
    requires_grad; plain values by value); any other object makes the forward its own key."""
    if isinstance(obj, torch.Tensor):
        return ("T", tuple(obj.shape), obj.dtype, obj.requires_grad)
    if isinstance(obj, _PLAIN):
        return (type(obj).__name__, obj)
    if type(obj) in (list, tuple, torch.Size):
        return (type(obj).__name__, *(_signature(v) for v in obj))
    if type(obj) is dict:
        return ("dict", *((_signature(k), _signature(v)) for k, v in obj.items()))
    return ("object", object())


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
