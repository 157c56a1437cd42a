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

import contextlib
import io
import os
import sys

import torch
from torch import nn
from torch.nn.modules.module import _addindent

from ..errors import InputError

__all__ = ["FlopsProfiler", "get_model_profile", "number_to_string", "macs_to_string", "flops_to_string",
           "params_to_string", "duration_to_string", "bytes_to_string", "ModuleProfile", "model_profile_text"]

DEFAULT_PRECISION = 2


# ---- DeepSpeed's number formats (same output, e.g. "1.23 G", "1.23 GMACs", "1.23 M") --------------

def number_to_string(num, units=None, precision=DEFAULT_PRECISION) -> str:
    scales = {"T": 1e12, "G": 1e9, "M": 1e6, "K": 1e3, "": 1, "m": 1e-3, "u": 1e-6}
    if units is None:
        if num >= 1e12:
            units = "T"
        elif num >= 1e9:
            units = "G"
        elif num >= 1e6:
            units = "M"
        elif num >= 1e3:
            units = "K"
        elif num >= 1 or num == 0:
            units = ""
        elif num >= 1e-3:
            units = "m"
        else:
            units = "u"
    return f"{round(num / scales.get(units, 1), precision):g} {units}"


def macs_to_string(macs, units=None, precision=DEFAULT_PRECISION) -> str:
    return f"{number_to_string(macs, units=units, precision=precision)}MACs"


def flops_to_string(flops, units=None, precision=DEFAULT_PRECISION) -> str:
    return f"{number_to_string(flops, units=units, precision=precision)}FLOPS"


def bytes_to_string(b, units=None, precision=DEFAULT_PRECISION) -> str:
    return f"{number_to_string(b, units=units, precision=precision)}B"


def params_to_string(params_num, units=None, precision=DEFAULT_PRECISION) -> str:
    units = units.replace("B", "G") if units else units
    return number_to_string(params_num, units=units, precision=precision).replace("G", "B").strip()


def duration_to_string(duration, units=None, precision=DEFAULT_PRECISION) -> str:
    return f"{number_to_string(duration, units=units, precision=precision)}s"


# ---- per-module aggregates, as DeepSpeed's get_module_flops/macs/duration define them --------------

class ModuleProfile:
    """Per module (by path), over every call of the profiled forward: ``macs`` and ``flops`` of the
    module and everything nested in it (DeepSpeed's get_module_macs/flops), ``duration`` the sum of
    its calls' forward times (DeepSpeed's __duration__), ``params`` its subtree's parameters."""

    def __init__(self, model: nn.Module, costs, latency=None) -> None:
        self.model = model
        self.macs: dict[str, int] = {}
        self.flops: dict[str, int] = {}
        self.duration: dict[str, float] = {}
        records = costs.layers if costs is not None else ()
        for path, _ in model.named_modules(remove_duplicate=False):
            self.macs.setdefault(path, 0)
            self.flops.setdefault(path, 0)
            self.duration.setdefault(path, 0.0)
        for r in records:          # self costs of every call, added to the call's module and its ancestors
            for p in _ancestors(r.path):
                if p in self.macs:
                    self.macs[p] += r.forward.macs
                    self.flops[p] += r.forward.flops
        if latency is not None:
            for lay in latency.layers:
                if lay.path in self.duration:
                    self.duration[lay.path] += lay.forward.median
        self.total_macs = costs.totals.macs if costs is not None else 0
        self.total_flops = costs.totals.flops if costs is not None else 0
        self.total_duration = self.duration.get("", 0.0)
        self.total_params = _params(model)

    def params(self, path: str) -> int:
        return _params(self.model.get_submodule(path))


def _ancestors(path: str):
    yield ""
    if path:
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            yield ".".join(parts[:i])


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in {id(p): p for p in module.parameters()}.values())


_NOTATIONS = ("Notations:\n"
              "data parallel size (dp_size), model parallel size(mp_size),\n"
              "number of parameters (params), number of multiply-accumulate operations(MACs),\n"
              "number of floating-point operations (flops), floating-point operations per second (FLOPS),\n"
              "fwd latency (forward propagation latency), bwd latency (backward propagation latency),\n"
              "step (weights update latency), iter latency (sum of fwd, bwd and step latency)\n")

_NOTE = ("\nNote: 1. A module can have torch.nn.module or torch.nn.functional to compute logits (e.g. "
         "CrossEntropyLoss). They are not counted as submodules, thus not to be printed out. However they "
         "make up the difference between a parent's MACs (or latency) and the sum of its submodules'.\n"
         "2. Number of floating-point operations is a theoretical estimation, thus FLOPS computed using "
         "that could be larger than the maximum system throughput.\n"
         "3. The fwd latency listed in the top module's profile is directly captured at the module forward "
         "function in PyTorch, thus it's less than the fwd latency shown above which is captured in "
         "DeepSpeed.\n")


def model_profile_text(prof: ModuleProfile, profile_step=1, module_depth=-1, top_modules=1,
                       detailed=True, fwd_latency: float | None = None) -> str:
    """DeepSpeed's print_model_profile output, as text."""
    out = io.StringIO()
    p = lambda *a: print(*a, file=out)  # noqa: E731
    line = "{:<70}  {:<8}"
    flops, macs, params = prof.total_flops, prof.total_macs, prof.total_params
    latency = prof.total_duration if fwd_latency is None else fwd_latency
    p("\n-------------------------- DeepSpeed Flops Profiler --------------------------")
    p(f"Profile Summary at step {profile_step}:")
    p(_NOTATIONS)
    p(line.format("params per GPU: ", params_to_string(params)))
    p(line.format("params of model = params per GPU * mp_size: ", params_to_string(params)))
    p(line.format("fwd MACs per GPU: ", macs_to_string(macs)))
    p(line.format("fwd flops per GPU: ", number_to_string(flops)))
    p(line.format("fwd flops of model = fwd flops per GPU * mp_size: ", number_to_string(flops)))
    p(line.format("fwd latency: ", duration_to_string(latency)))
    p(line.format("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ",
                  flops_to_string(flops / latency if latency else 0)))
    p("\n----------------------------- Aggregated Profile per GPU -----------------------------")
    out.write(_aggregated(prof, module_depth, top_modules))
    if detailed:
        p("\n------------------------------ Detailed Profile per GPU ------------------------------")
        p("Each module profile is listed after its name in the following order: \nparams, percentage of "
          "total params, MACs, percentage of total MACs, fwd latency, percentage of total fwd latency, "
          "fwd FLOPS")
        p(_NOTE)
        p(_module_repr(prof, prof.model, ""))
    p("------------------------------------------------------------------------------")
    return out.getvalue()


def _aggregated(prof: ModuleProfile, module_depth: int, top_modules: int) -> str:
    info: dict[int, dict[str, list]] = {}

    def walk(module: nn.Module, path: str, depth: int) -> None:
        row = info.setdefault(depth, {}).setdefault(module.__class__.__name__, [0, 0, 0.0])
        row[0] += prof.macs.get(path, 0)
        row[1] += _params(module)
        row[2] += prof.duration.get(path, 0.0)
        for name, child in module._modules.items():
            if child is not None:
                walk(child, f"{path}.{name}" if path else name, depth + 1)

    walk(prof.model, "", 0)
    depth = len(info) - 1 if module_depth == -1 else module_depth
    lines = [f"Top {top_modules} modules in terms of params, MACs or fwd latency at different model depths:"]
    for d in range(depth):
        if d not in info:
            break
        n = min(top_modules, len(info[d]))
        top = lambda k, f: {name: f(v[k]) for name, v in  # noqa: E731
                            sorted(info[d].items(), key=lambda it: it[1][k], reverse=True)[:n]}
        lines += [f"depth {d}:", f"    params      - {top(1, params_to_string)}",
                  f"    MACs        - {top(0, macs_to_string)}", f"    fwd latency - {top(2, duration_to_string)}"]
    return "\n".join(lines) + "\n"


def _module_repr(prof: ModuleProfile, module: nn.Module, path: str) -> str:
    """nn.Module.__repr__ with DeepSpeed's profile in front of each module's extra_repr; the model's
    own extra_repr is not replaced (DeepSpeed patches it while printing)."""
    params = _params(module)
    macs, flops, dur = prof.macs.get(path, 0), prof.flops.get(path, 0), prof.duration.get(path, 0.0)
    pct = lambda a, b: round(100 * a / b, DEFAULT_PRECISION) if b else 0  # noqa: E731
    items = [f"{params_to_string(params)} = {pct(params, prof.total_params):g}% Params",
             f"{macs_to_string(macs)} = {pct(macs, prof.total_macs):g}% MACs",
             f"{duration_to_string(dur)} = {pct(dur, prof.total_duration):g}% latency",
             flops_to_string(round(flops / dur, DEFAULT_PRECISION) if dur else 0)]
    own = module.extra_repr()
    if own:
        items.append(own)
    extra_lines = ", ".join(items).split("\n")
    child_lines = []
    for name, child in module._modules.items():
        if child is None:
            continue
        text = _addindent(_module_repr(prof, child, f"{path}.{name}" if path else name), 2)
        child_lines.append(f"({name}): {text}")
    lines = extra_lines + child_lines
    main = module._get_name() + "("
    if len(extra_lines) == 1 and not child_lines:
        main += extra_lines[0]
    else:
        main += "\n  " + "\n  ".join(lines) + "\n"
    return main + ")"


@contextlib.contextmanager
def _to_file(output_file):
    """DeepSpeed's output_file: the profile goes there instead of stdout."""
    if not output_file:
        yield sys.stdout
        return
    d = os.path.dirname(os.path.abspath(output_file))
    os.makedirs(d, exist_ok=True)
    with open(output_file, "w") as f:
        yield f


# ---- FlopsProfiler ----------------------------------------------------------------------------------

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
        print(_aggregated(self._prof._module_profile(), module_depth, top_modules), end="")


def get_model_profile(model: nn.Module, input_shape=None, args=[], kwargs={}, print_profile=True,  # noqa: B006
                      detailed=True, module_depth=-1, top_modules=1, warm_up=1, as_string=True,
                      output_file=None, ignore_modules=None, mode="forward"):
    """DeepSpeed's get_model_profile: ``warm_up`` forwards, then one profiled forward in eval mode
    (the model's flags are restored afterwards; DeepSpeed leaves it in eval). Returns
    ``(flops, macs, params)``, as strings ("1.2 G", "0.6 GMACs", "3.4 M") with ``as_string``."""
    from ..api import _check_model, analyze, profile
    _check_model(model)
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
        costs = analyze(model, *args, mode="same", **kwargs)
        latency = None if meta else profile(model, *args, warmup=warm_up, repeats=1, **kwargs)
    finally:
        for m, t in flags:
            m.training = t
    prof = ModuleProfile(model, costs, latency)
    if print_profile:
        text = model_profile_text(prof, warm_up, module_depth, top_modules, detailed)
        with _to_file(output_file) as f:
            f.write(text)
    flops, macs, params = prof.total_flops, prof.total_macs, prof.total_params
    if as_string:
        return number_to_string(flops), macs_to_string(macs), params_to_string(params)
    return flops, macs, params


def _device(model: nn.Module) -> torch.device:
    from ..capture import model_device
    return model_device(model)
