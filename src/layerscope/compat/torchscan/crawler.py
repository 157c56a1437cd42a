"""torchscan 0.2's ``crawl_module`` and ``summary`` with layerscope's numbers.

One forward runs, in eval mode without gradients (every module's flag restored after, as torchscan):
layerscope's op recorder counts each op in the module call it ran in, and hooks of this front end
describe each call (path, call index, the structure of its inputs and outputs, the parameters and
buffers it holds that no earlier call showed). Per call, ``module_flops``, ``macs`` and ``dmas`` are
the ops that ran in that call itself (its children's in their own rows), so the layers add up to the
totals; a leaf has them always, a container when it ran ops of its own (torchscan gives containers
none and misses the ops they run). ``dmas`` is the bytes read and written divided by the model's
floating-point element size. An op without a formula makes its call's metric and the total partial,
with a diagnostic naming it (torchscan: a module type without a formula). ``receptive_field`` and
the effective stride and padding are layerscope's receptive field of the call's output with respect to
the model's input (first spatial dimension). ``operator_flops`` comes from the same forward.
"""

from __future__ import annotations

import inspect
import platform
import threading
from collections.abc import Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch
from torch import nn

from ...capture import hooks
from ...capture.shadow import shadow_of
from ...capture.inputs import iter_tensors
from .flops import METHOD, Op, flop_report
from .modules import module_dmas, module_flops, module_macs, module_rf  # noqa: F401 (torchscan's crawler names)
from .report import AnalysisReport, Diagnostic, IncompleteAnalysisError, LayerReport, MetricResult, metric_result
from .utils import aggregate_info, format_info

__all__ = ["crawl_module", "summary"]



def _package_version() -> str:
    try:
        return f"layerscope {version('layerscope')}"
    except PackageNotFoundError:
        return "unknown"


def describe(value: Any) -> dict[str, Any]:
    """A value's structure and tensor metadata, never its contents (torchscan's layer metadata)."""
    if isinstance(value, torch.Tensor):
        return dict(kind="tensor", shape=list(value.shape), dtype=str(value.dtype), device=str(value.device),
                    requires_grad=value.requires_grad)
    if value is None:
        return {"kind": "none"}
    if isinstance(value, (tuple, list)):
        return {"kind": "tuple" if isinstance(value, tuple) else "list", "items": [describe(v) for v in value]}
    if isinstance(value, Mapping):
        items = []
        for k, v in value.items():
            item = {"key": k} if isinstance(k, int) or (isinstance(k, str) and k.isidentifier()) else {}
            items.append({**item, "key_type": type(k).__name__, "value": describe(v)})
        return {"kind": "mapping", "type": type(value).__name__, "items": items}
    if isinstance(value, (bool, int, float, complex, str, bytes)):
        return {"kind": "scalar", "type": type(value).__name__}
    return {"kind": "object", "type": type(value).__qualname__}


def _describe_call(args: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    return {"args": [describe(a) for a in args], "kwargs": {k: describe(v) for k, v in kwargs.items()}}


def _defaults(module: nn.Module) -> tuple[torch.device, torch.dtype]:
    t = next(module.parameters(), None)
    if t is None:
        t = next(module.buffers(), None)
    return (torch.device("cpu"), torch.float32) if t is None else (t.device, t.dtype)


def _generated(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A batch of 1: True for booleans, 0 for integers (torchscan's), else uniform values drawn from a
    generator of its own (the process's random state is not touched)."""
    if dtype == torch.bool:
        return torch.ones(1, *shape, dtype=dtype, device=device)
    if not (dtype.is_floating_point or dtype.is_complex):
        return torch.zeros(1, *shape, dtype=dtype, device=device)
    if device.type == "meta":
        return torch.empty(1, *shape, dtype=dtype, device=device)
    generator = torch.Generator(device=device).manual_seed(0)
    return torch.rand(1, *shape, device=device, generator=generator).to(dtype)


def _prepare_inputs(module, input_shape, dtype, args, kwargs, device):
    """(args, kwargs, the inputs' description): the caller's own, or a batch of 1 per shape."""
    provided, generated = args is not None or kwargs is not None, input_shape is not None
    if provided == generated:
        raise ValueError("Exactly one of input_shape or args/kwargs must be provided.")
    if provided:
        if dtype is not None or device is not None:
            raise ValueError("dtype and device apply only to generated input_shape tensors.")
        if args is not None and not isinstance(args, tuple):
            raise TypeError(f"args must be a tuple, got {type(args).__name__}.")
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise TypeError(f"kwargs must be a mapping, got {type(kwargs).__name__}.")
        call_args, call_kwargs = args or (), dict(kwargs or {})
        if any(not isinstance(k, str) for k in call_kwargs):
            raise TypeError("kwargs keys must be strings.")
        return call_args, call_kwargs, {"source": "provided", **_describe_call(call_args, call_kwargs)}
    shapes = input_shape if isinstance(input_shape, list) else [input_shape]
    if not shapes or any(not isinstance(s, tuple) for s in shapes):
        raise TypeError("input_shape must be a tuple or a non-empty list of tuples.")
    if any(not isinstance(d, int) or isinstance(d, bool) for s in shapes for d in s):
        raise TypeError("Every input_shape dimension must be an integer.")
    if any(d < 0 for s in shapes for d in s):
        raise ValueError(f"input_shape dimensions must be >= 0, got {input_shape!r}.")
    where, default = _defaults(module)
    where = where if device is None else torch.device(device)
    if isinstance(dtype, (str, bytes)) or not (dtype is None or isinstance(dtype, (torch.dtype, Iterable))):
        raise TypeError(f"dtype must be a torch.dtype or an iterable of them, got {dtype!r}.")
    if dtype is None or isinstance(dtype, torch.dtype):
        dtypes = [dtype or default] * len(shapes)
    else:
        dtypes = list(dtype)
        if len(dtypes) != len(shapes):
            raise ValueError("dtype length must match the number of input shapes.")
        if any(not isinstance(d, torch.dtype) for d in dtypes):
            raise TypeError("Every dtype value must be a torch.dtype.")
    try:
        call_args = tuple(_generated(s, d, where) for s, d in zip(shapes, dtypes))
    except RuntimeError as e:
        raise ValueError(f"cannot make the inputs on {where}: {str(e).splitlines()[0]}") from None
    return call_args, {}, {"source": "generated", **_describe_call(call_args, {})}


def _metric(value: int | float, uncounted: bool, unit: str, scope: str = "module_call") -> MetricResult:
    if uncounted:
        return metric_result(status="partial", known_value=value, unit=unit, scope=scope, method=METHOD)
    return metric_result(status="complete", value=value, unit=unit, scope=scope, method=METHOD)


def _aggregate_metric(layers: list[LayerReport], name: str, unit: str) -> MetricResult:
    """A metric over the layers that have it: complete when each is, else the known part (partial)."""
    results = [layer["metrics"][name] for layer in layers if name in layer["metrics"]]
    if not results:
        return metric_result(status="unavailable", unit=unit, scope="forward", method=METHOD)
    known = sum(r["known_value"] for r in results if r["known_value"] is not None)
    return _metric(known, any(r["status"] != "complete" for r in results), unit, "forward")


def _is_transformer_root(current: nn.Module, root: nn.Module) -> bool:
    return current is root and isinstance(root, nn.Transformer)


def crawl_module(module: nn.Module, input_shape: list[tuple[int, ...]] | tuple[int, ...] | None = None,
                 dtype: torch.dtype | Iterable[torch.dtype] | None = None, *, args: tuple | None = None,
                 kwargs: Mapping[str, Any] | None = None, device: str | torch.device | None = None,
                 strict: bool = False) -> AnalysisReport:
    """The report of one inference forward (eval mode, no gradients; the module comes out as it went in)."""
    from ...api import analyze
    if not isinstance(module, nn.Module):
        raise TypeError(f"crawl_module analyses a torch.nn.Module, got {type(module).__name__}.")
    call_args, call_kwargs, inputs = _prepare_inputs(module, input_shape, dtype, args, kwargs, device)
    # hooks and the mode go on a copy of the module tree (capture/shadow.py): another thread calling
    # the model meanwhile meets none of them (issue 58)
    module = shadow_of(module)
    owner = threading.get_ident()      # a call from another thread is not this forward's (nor recorded)
    layers: list[LayerReport] = []
    pending: dict[int, list[int]] = {}
    calls: dict[int, int] = {}
    seen: set[int] = set()
    handles = []
    torch_type: list[bool] = []         # per row: the module's type is one torch ships (nn.Identity)

    def register(current: nn.Module, path: str) -> None:
        def pre(hooked, hook_args, hook_kwargs):
            if threading.get_ident() != owner:
                return
            index = calls.get(id(hooked), 0)
            calls[id(hooked)] = index + 1
            held = dict(trainable=0, frozen=0, bytes=0, shared=False)
            bufs = dict(elements=0, bytes=0, shared=False)
            # a call shows what it holds that no earlier call showed (a transformer root: all it holds)
            recurse = (_is_transformer_root(hooked, module) or isinstance(hooked, nn.MultiheadAttention)
                       or not any(True for _ in hooked.children()))
            for p in hooked.parameters(recurse=recurse):
                if id(p) in seen:
                    held["shared"] = True
                    continue
                seen.add(id(p))
                held["trainable" if p.requires_grad else "frozen"] += p.numel()
                held["bytes"] += p.numel() * p.element_size()
            for b in hooked.buffers(recurse=recurse):
                if id(b) in seen:
                    bufs["shared"] = True
                    continue
                seen.add(id(b))
                bufs["elements"] += b.numel()
                bufs["bytes"] += b.numel() * b.element_size()
            layers.append(dict(
                path=path, call_index=index, name=path.rpartition(".")[-1] or type(hooked).__name__.lower(),
                depth=0 if not path else path.count(".") + 1, type=type(hooked).__name__,
                input=_describe_call(hook_args, hook_kwargs), output={"kind": "pending"}, parameters=held,
                buffers=bufs, metrics={"calls": metric_result(status="complete", value=1, unit="calls",
                                                              scope="module_call", method="pytorch_hook")}))
            torch_type.append(type(hooked).__module__.startswith("torch."))
            pending.setdefault(id(hooked), []).append(len(layers) - 1)

        def post(hooked, hook_args, hook_kwargs, output):
            if threading.get_ident() == owner and pending.get(id(hooked)):
                layers[pending[id(hooked)].pop()]["output"] = describe(output)

        handles.append(hooks.forward_pre_hook(current, pre, with_kwargs=True))
        handles.append(hooks.forward_hook(current, post, with_kwargs=True))

    targets = [("", module)] if isinstance(module, nn.Transformer) else list(module.named_modules())
    flags = [(m, m.training) for m in module.modules()]
    try:
        for path, current in targets:
            if not isinstance(current, torch.jit.ScriptModule):    # TorchScript takes no hooks
                register(current, path)
        with torch.no_grad():
            rep = analyze(module, *call_args, forward_kwargs=call_kwargs, mode="eval")
    finally:
        for h in handles:
            h.remove()
        for m, t in flags:
            m.training = t

    trace = rep.trace
    # DMAs count elements of the model's floating-point parameters' size, else its inputs', else float32's
    first = next((t for t in (*module.parameters(), *iter_tensors((call_args, call_kwargs))) if t.is_floating_point()),
                 None)
    itemsize = first.element_size() if first is not None else 4
    uncounted: dict[int, list[str]] = {}
    ran: dict[int, int] = {}                # record index -> forward ops it ran itself, of any kind
    for e in trace.ops:
        if e.phase == "forward":
            ran[e.layer] = ran.get(e.layer, 0) + 1
            if e.status == "uncounted":
                uncounted.setdefault(e.layer, []).append(e.op)
    by_key = {(r.path, r.call_index): r for r in rep.layers}
    row_of = {}                             # record index -> its row
    for layer in layers:
        r = by_key.get((layer["path"], layer["call_index"]))
        if r is not None:
            row_of[r.index] = layer
    # each call's own ops go to its row; a call without a row (a TorchScript module takes no hooks; an
    # nn.Transformer root is one row) to its nearest caller that has one, so the rows add up to the forward
    records = {r.index: r for r in rep.layers}
    own: dict[int, list] = {}               # row's record index -> [flops, macs, bytes, ops without formula]
    for r in rep.layers:
        target = r
        while target.index not in row_of and target.parent is not None:
            target = records[target.parent]
        if target.index not in row_of:
            continue
        acc = own.setdefault(target.index, [0, 0, 0, set()])
        acc[0] += r.forward.flops
        acc[1] += r.forward.macs
        acc[2] += r.forward.bytes_moved
        acc[3].update(uncounted.get(r.index, ()))
    diagnostics: list[Diagnostic] = []
    for row, layer in enumerate(layers):
        r = by_key.get((layer["path"], layer["call_index"]))
        m = layer["metrics"]
        if r is None:           # a call the hooks saw and layerscope's recorder did not: say so, count nothing
            for metric, unit in (("module_flops", "FLOPs"), ("macs", "MACs"), ("dmas", "DMAs")):
                m[metric] = metric_result(status="unavailable", unit=unit, scope="module_call", method=METHOD)
                diagnostics.append(dict(code="unrecorded_call", severity="warning", metric=metric,
                                        path=layer["path"], message="layerscope's recorder has no record of "
                                        "this call: its ops are not counted here."))
            continue
        flops, macs, moved, missing = own.get(r.index, (0, 0, 0, set()))
        if r.children and not (flops or macs or moved or missing):
            continue                # a container that ran no op of its own
        # a leaf of the user's own type that ran no op at all: 0 is what the recorder saw, but work done
        # outside torch (NumPy, Python numbers) is invisible to it, so the 0 is not known to be the whole
        # count (torch-scan 0.2: partial, and strict=True raises; its tests/test_report.py). A module
        # torch ships (nn.Identity) that runs no op does nothing: 0, complete.
        unseen = not r.children and not ran.get(r.index) and not torch_type[row]
        m["module_flops"] = _metric(flops, bool(missing) or unseen, "FLOPs")
        m["macs"] = _metric(macs, bool(missing) or unseen, "MACs")
        m["dmas"] = _metric(moved // itemsize, bool(missing) or unseen, "DMAs")
        if unseen:
            for metric in ("module_flops", "macs", "dmas"):
                diagnostics.append(dict(code="no_operator", severity="warning", metric=metric, path=layer["path"],
                                        message=f"{layer['type']} ran no torch op in this call: work done outside "
                                        "torch (NumPy, Python numbers) is not seen, so 0 is a lower bound."))
        for op in sorted(missing):
            for metric in ("module_flops", "macs", "dmas"):
                diagnostics.append(dict(code="uncounted_operator", severity="warning", metric=metric,
                                        path=layer["path"], operator=op,
                                        message=f"{op} ran in this call, but no formula is registered."))
        rf = r.receptive_field
        for name, v in zip(("receptive_field", "effective_stride", "effective_padding"),
                           (rf.size, rf.stride, rf.padding) if rf is not None and rf.size else (None,) * 3):
            m[name] = (metric_result(status="unavailable", unit="elements", scope="module_call", method=METHOD)
                       if v is None else metric_result(status="complete", value=float(v[0]), unit="elements",
                                                       scope="module_call", method=METHOD))

    ops = [Op(e.op, e.status, e.costs.flops) for e in trace.ops if e.phase == "forward"]
    by_module: dict[str, int] = {}
    for r in rep.layers:                  # every call of a module added up, as FlopCounterMode's names
        name = type(module).__name__ + (f".{r.path}" if r.path else "")
        by_module[name] = by_module.get(name, 0) + r.forward_total.flops
    op_report = flop_report(ops, by_module, "workload")
    diagnostics.extend(op_report["diagnostics"])
    params, buffers = list(module.parameters()), list(module.buffers())
    trainable = sum(p.numel() for p in params if p.requires_grad)
    frozen = sum(p.numel() for p in params if not p.requires_grad)
    tensors = [*params, *buffers]

    def model_total(value: int, unit: str) -> MetricResult:
        return metric_result(status="complete", value=value, unit=unit, scope="model", method="pytorch")

    report: AnalysisReport = dict(
        schema_version=1,
        context=dict(torchscan_version=_package_version(), torch_version=torch.__version__,
                     python_version=platform.python_version(),
                     model_type=f"{type(module).__module__}.{type(module).__qualname__}",
                     execution_mode="evaluation_no_grad", training_before=flags[0][1],
                     devices=sorted({str(t.device) for t in tensors}), dtypes=sorted({str(t.dtype) for t in tensors})),
        inputs=inputs,
        layers=layers,
        operator_flops=op_report,
        totals=dict(
            parameters=model_total(trainable + frozen, "elements"),
            trainable_parameters=model_total(trainable, "elements"),
            frozen_parameters=model_total(frozen, "elements"),
            parameter_bytes=model_total(sum(p.numel() * p.element_size() for p in params), "bytes"),
            buffer_elements=model_total(sum(b.numel() for b in buffers), "elements"),
            buffer_bytes=model_total(sum(b.numel() * b.element_size() for b in buffers), "bytes"),
            module_flops=_aggregate_metric(layers, "module_flops", "FLOPs"),
            operator_flops=op_report["total"],
            macs=_aggregate_metric(layers, "macs", "MACs"),
            dmas=_aggregate_metric(layers, "dmas", "DMAs")),
        diagnostics=diagnostics)
    if strict and (diagnostics or any(r["status"] != "complete" for r in report["totals"].values())):
        raise IncompleteAnalysisError(report)
    return report


def summary(module: nn.Module, input_shape: list[tuple[int, ...]] | tuple[int, ...] | None = None,
            wrap_mode: str = "mid", max_depth: int | None = None, receptive_field: bool = False,
            effective_rf_stats: bool = False, *, dtype: torch.dtype | Iterable[torch.dtype] | None = None,
            args: tuple | None = None, kwargs: Mapping[str, Any] | None = None,
            device: str | torch.device | None = None, strict: bool = False) -> AnalysisReport:
    """Prints the report's table (down to ``max_depth``) and returns the whole report."""
    report = crawl_module(module, input_shape, dtype, args=args, kwargs=kwargs, device=device, strict=strict)
    shown = aggregate_info(report, max_depth) if isinstance(max_depth, int) else report
    print(format_info(shown, wrap_mode, receptive_field, effective_rf_stats))
    return report


_ = inspect  # torchscan's crawler module exposes ``inspect`` (its tests patch crawler.inspect.signature)
