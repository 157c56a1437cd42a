"""DeepSpeed flops profiler's printed formats ("1.23 G", "1.23 GMACs", its profile sections), drawn
from layerscope's reports. Here, below the profiler, so that ``Profiler``'s DeepSpeed getters and
``layerscope.compat.deepspeed`` share them without importing each other."""

from __future__ import annotations

import contextlib
import io
import os
import sys

from torch import nn
from torch.nn.modules.module import _addindent

from ..capture.records import param_totals
from .units import deepspeed_number

__all__ = ["number_to_string", "macs_to_string", "flops_to_string", "params_to_string", "duration_to_string",
           "bytes_to_string", "ModuleProfile", "model_profile_text", "DEFAULT_PRECISION", "aggregated_profile",
           "module_params", "to_output_file"]

DEFAULT_PRECISION = 2


# ---- DeepSpeed's number formats (same output, e.g. "1.23 G", "1.23 GMACs", "1.23 M") --------------

number_to_string = deepspeed_number     # DeepSpeed's name for it (render.units holds every number style)


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
    its calls' forward times (DeepSpeed's __duration__), ``params`` its subtree's parameters.

    ``costs``: the forward's Report, or a list of Reports, one per forward, added up; or ``own``: the
    (MACs, FLOPs) of the ops run in each module path's own calls, counted as the forwards ran (the
    training-loop profiler). ``durations``: seconds by module path, in place of ``latency``'s medians.
    ``uncounted``: calls by op of the ops without a formula (their FLOPs are not in the figures); with
    ``costs``, the Reports' coverage."""

    def __init__(self, model: nn.Module, costs, latency=None, durations: dict[str, float] | None = None,
                 own: dict[str, tuple[int, int]] | None = None, uncounted: dict[str, int] | None = None) -> None:
        self.model = model
        self.macs: dict[str, int] = {}
        self.flops: dict[str, int] = {}
        self.duration: dict[str, float] = {}
        reports = [] if costs is None else list(costs) if isinstance(costs, (list, tuple)) else [costs]
        for path, _ in model.named_modules(remove_duplicate=False):
            self.macs.setdefault(path, 0)
            self.flops.setdefault(path, 0)
            self.duration.setdefault(path, 0.0)
        if own is None:     # self costs of every call, added to the call's module and its ancestors
            own = {}
            for r in (r for rep in reports for r in rep.layers):
                m, f = own.get(r.path, (0, 0))
                own[r.path] = (m + r.forward.macs, f + r.forward.flops)
        for path, (macs, flops) in own.items():
            for p in _ancestors(path):
                if p in self.macs:
                    self.macs[p] += macs
                    self.flops[p] += flops
        if durations is not None:
            for path, seconds in durations.items():
                if path in self.duration:
                    self.duration[path] += seconds
        elif latency is not None:
            for lay in latency.layers:
                if lay.path in self.duration:
                    self.duration[lay.path] += lay.forward.median
        self.total_macs = sum(m for m, _ in own.values())
        self.total_flops = sum(f for _, f in own.values())
        self.total_duration = self.duration.get("", 0.0)
        # the Report's total where there is one (the same sum: capture.records.param_totals)
        self.total_params = reports[0].totals.params if reports else module_params(model)
        if uncounted is None:
            uncounted = {}
            for rep in reports:
                for u in rep.coverage.uncounted:
                    uncounted[u.op] = uncounted.get(u.op, 0) + u.count
        self.uncounted = uncounted

    def params(self, path: str) -> int:
        return module_params(self.model.get_submodule(path))


def _ancestors(path: str):
    yield ""
    if path:
        parts = path.split(".")
        for i in range(1, len(parts) + 1):
            yield ".".join(parts[:i])


def module_params(module: nn.Module) -> int:
    """A module's parameters, tied ones once (``capture.records.param_totals``, the Report's count)."""
    return param_totals(module)[0]


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
                       detailed=True, fwd_latency: float | None = None, engine=None,
                       recompute_fwd_factor: float = 0.0) -> str:
    """DeepSpeed's print_model_profile output, as text. ``engine``: DeepSpeed's engine, or any object
    with its attributes (``world_size``, ``dp_world_size`` (None: ``seq_dp_world_size``),
    ``mp_world_size``, ``has_moe_layers``, ``train_micro_batch_size_per_gpu()``,
    ``wall_clock_breakdown()`` and, where that is true, ``timers(name).elapsed(False)`` in ms), read as
    DeepSpeed reads it: its sizes printed, the model's params and flops = per GPU x mp_size, and its
    forward, backward and step timers in place of the measured forward latency."""
    out = io.StringIO()
    p = lambda *a: print(*a, file=out)  # noqa: E731
    line = "{:<70}  {:<8}"
    flops, macs, params = prof.total_flops, prof.total_macs, prof.total_params
    latency = prof.total_duration if fwd_latency is None else fwd_latency
    mp = engine.mp_world_size if engine else 1
    timed = bool(engine) and engine.wall_clock_breakdown()
    if timed:
        latency = engine.timers("fwd").elapsed(False) / 1000.0
    p("\n-------------------------- DeepSpeed Flops Profiler --------------------------")
    p(f"Profile Summary at step {profile_step}:")
    p(_NOTATIONS)
    if engine:
        dp = engine.dp_world_size
        p(line.format("world size: ", engine.world_size))
        p(line.format("data parallel size: ", engine.seq_dp_world_size if dp is None else dp))
        p(line.format("model parallel size: ", mp))
        p(line.format("batch size per GPU: ", engine.train_micro_batch_size_per_gpu()))
        if engine.has_moe_layers:
            p(line.format("expert tensor parallelism enabled: ", mp > 1 and _expert_tensor_parallel(prof.model)))
    p(line.format("params per GPU: ", params_to_string(params)))
    p(line.format("params of model = params per GPU * mp_size: ", params_to_string(params * mp)))
    p(line.format("fwd MACs per GPU: ", macs_to_string(macs)))
    p(line.format("fwd flops per GPU: ", number_to_string(flops)))
    if prof.uncounted:      # never a silent zero: the ops without a formula, which the figures leave out
        p(line.format("ops without a FLOP formula (not in MACs or flops): ",
                      ", ".join(f"{op} x{n}" for op, n in sorted(prof.uncounted.items()))))
    p(line.format("fwd flops of model = fwd flops per GPU * mp_size: ", number_to_string(flops * mp)))
    p(line.format("fwd latency: ", duration_to_string(latency)))
    p(line.format("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ",
                  flops_to_string(flops / latency if latency else 0)))
    if timed:
        factor = 2 + recompute_fwd_factor
        bwd = engine.timers("bwd").elapsed(False) / 1000.0
        step = engine.timers("step").elapsed(False) / 1000.0
        per = lambda n, s: flops_to_string(n / s if s else 0)  # noqa: E731
        p(line.format("bwd latency: ", duration_to_string(bwd)))
        p(line.format(f"bwd FLOPS per GPU = {factor:g} * fwd flops per GPU / bwd latency: ", per(factor * flops, bwd)))
        p(line.format(f"fwd+bwd FLOPS per GPU = {factor + 1:g} * fwd flops per GPU / (fwd+bwd latency): ",
                      per((factor + 1) * flops, latency + bwd)))
        p(line.format("step latency: ", duration_to_string(step)))
        it = latency + bwd + step
        p(line.format("iter latency: ", duration_to_string(it)))
        p(line.format(f"FLOPS per GPU = {factor + 1:g} * fwd flops per GPU / iter latency: ",
                      per((factor + 1) * flops, it)))
        samples = engine.train_micro_batch_size_per_gpu() * engine.world_size
        p(line.format("samples/second: ", round(samples / it, DEFAULT_PRECISION) if it else 0))
    p("\n----------------------------- Aggregated Profile per GPU -----------------------------")
    out.write(aggregated_profile(prof, module_depth, top_modules))
    if detailed:
        p("\n------------------------------ Detailed Profile per GPU ------------------------------")
        p("Each module profile is listed after its name in the following order: \nparams, percentage of "
          "total params, MACs, percentage of total MACs, fwd latency, percentage of total fwd latency, "
          "fwd FLOPS")
        p(_NOTE)
        p(_module_repr(prof, prof.model, ""))
    p("------------------------------------------------------------------------------")
    return out.getvalue()


def _expert_tensor_parallel(model: nn.Module) -> bool:
    """DeepSpeed's is_expert_tensor_parallelism_enabled: the first MoE layer's setting."""
    for m in model.modules():
        if type(m).__name__ == "MoE" and hasattr(m, "enable_expert_tensor_parallelism"):
            return bool(m.enable_expert_tensor_parallelism)
    return False


def aggregated_profile(prof: ModuleProfile, module_depth: int, top_modules: int) -> str:
    info: dict[int, dict[str, list]] = {}

    def walk(module: nn.Module, path: str, depth: int) -> None:
        row = info.setdefault(depth, {}).setdefault(module.__class__.__name__, [0, 0, 0.0])
        row[0] += prof.macs.get(path, 0)
        row[1] += module_params(module)
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
    params = module_params(module)
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
def to_output_file(output_file):
    """DeepSpeed's output_file: the profile goes there instead of stdout."""
    if not output_file:
        yield sys.stdout
        return
    d = os.path.dirname(os.path.abspath(output_file))
    os.makedirs(d, exist_ok=True)
    with open(output_file, "w") as f:
        yield f


# ---- FlopsProfiler ----------------------------------------------------------------------------------
