"""Options of the entry points given as names or objects, resolved and checked once: optimizers,
autocast dtypes, and the forward's own keywords kept apart from the options."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

import torch

from .errors import InputError

__all__ = ["Mode", "Causal", "Schedule", "AnalyzeOptions", "MemoryOptions", "ProfileOptions", "OnnxOptions",
           "TileOptions", "entry_options", "forward_inputs", "optimizers", "optimizer_factory", "parse_autocast", "optimizer_name"]

Mode = Literal["eval", "train", "same"]          # the model's flags for the run ("same": as they are)
Causal = Literal["dense", "unmasked"]            # causal attention as the kernel computes it, or its half
Schedule = Literal["gpipe", "1f1b", "interleaved", "zb", "zbv"]


def _choice(name: str, value: Any, allowed) -> None:
    options = get_args(allowed)
    if value not in options:
        quoted = [repr(o) for o in options]
        raise InputError(f"{name} must be {', '.join(quoted[:-1])} or {quoted[-1]}, got {value!r}")


@dataclass(frozen=True, slots=True)
class AnalyzeOptions:
    """Every option of ``analyze()`` (``activations()`` takes its ``mode``; ``analyze_exported()`` and
    ``analyze_torchscript()`` those that apply to a graph): checked when made."""

    input_size: Any = None           # builds example inputs, as torchinfo's input_size does
    dtypes: Any = None
    batch_dim: int | None = None
    device: Any = None               # where the analysis runs ("meta": nothing computed)
    mode: Mode = "eval"
    backward: bool = False
    causal: Causal = "dense"
    costs: Any = None                # a layerscope.costs.CostRegistry (checked by the API, a layer up)

    def __post_init__(self) -> None:
        _choice("mode", self.mode, Mode)
        _choice("causal", self.causal, Causal)


@dataclass(frozen=True, slots=True)
class MemoryOptions:
    """Every option of ``memory()`` (and of the steps ``max_batch_size()`` simulates): checked, the
    optimizer and autocast dtype resolved."""

    optimizer: Any = None            # a callable params -> Optimizer (from a class, name or instance)
    training: bool = True
    autocast_dtype: torch.dtype | None = None
    device: Any = None               # where the memory is predicted for (default: where the model is)
    batch_dim: int | None = None
    input_size: Any = None
    dtypes: Any = None
    batch_size: int | None = None
    loss_fn: Any = None
    steps: int = 2
    accumulation: int = 1
    simulate: bool = True
    measure: bool | None = None
    limit: Any = None                # bytes or "80GiB", shown against the peak
    progress: bool = False

    def __post_init__(self) -> None:
        if self.steps < 1 or self.accumulation < 1:
            raise InputError("steps and accumulation must be at least 1")
        if self.optimizer is not None and not self.training:
            raise InputError("an optimizer only applies to a training step (training=True)")
        if self.batch_size is not None and self.batch_size < 1:
            raise InputError(f"batch_size must be at least 1, got {self.batch_size}")
        object.__setattr__(self, "optimizer", optimizer_factory(self.optimizer))
        object.__setattr__(self, "autocast_dtype", parse_autocast(self.autocast_dtype))


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """Every option of ``profile()``: the timed runs and what they run on."""

    warmup: int | str = "auto"
    repeats: int | str = "auto"
    backward: bool = False
    device: Any = None               # where example inputs built from input_size go
    input_size: Any = None
    dtypes: Any = None
    loss_fn: Any = None
    roofline: Any = None
    progress: bool = False

    def __post_init__(self) -> None:
        def ok(v, least: int) -> bool:
            return v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= least)
        if not ok(self.warmup, 0) or not ok(self.repeats, 1):
            raise InputError(f"warmup must be >= 0 and repeats >= 1 (or \"auto\"), got {self.warmup!r} and "
                             f"{self.repeats!r}")


@dataclass(frozen=True, slots=True)
class OnnxOptions:
    """Every option of ``analyze_onnx()``."""

    input_shapes: dict | None = None  # {input name: shape} and/or {symbolic dim: value}
    costs: Any = None                 # a layerscope.costs.CostRegistry (checked by the API, a layer up)


@dataclass(frozen=True, slots=True)
class TileOptions:
    """Every option of ``onnx_tile()``."""

    block: tuple = (64, 64, 64)       # (M, K, N) of each block
    ops: tuple = ("Gemm", "MatMul")
    nodes: Any = None
    input_shapes: dict | None = None
    verify: bool = False


def _at_default(value: Any, default: Any) -> bool:
    return value is default or (type(value) is type(default) and value == default)


def entry_options(cls, options, kwargs: dict, forward_kwargs: dict | None = None, *, take: bool = True,
                  **named: Any):
    """``(options object, the forward's keyword inputs)`` of one call of an entry point, built once.

    ``named``: the options the signature names. With ``take``, every other option of ``cls`` is still
    accepted as a keyword (taken out of ``kwargs``, as the entry point took it before options were
    objects); the rest of ``kwargs``, with ``forward_kwargs``, goes to the forward. With ``options=``
    given (an instance of ``cls``), an option also given as a keyword (a named one away from its
    default, or one taken out of ``kwargs``) is an InputError: each option has one source."""
    known = {f.name: f.default for f in fields(cls)}
    taken = {k: v for k, v in kwargs.items() if take and k in known}
    forward = forward_inputs({k: v for k, v in kwargs.items() if k not in taken}, forward_kwargs)
    if options is None:
        return cls(**named, **taken), forward
    if not isinstance(options, cls):
        raise InputError(f"options must be a layerscope.{cls.__name__}, got {type(options).__name__}")
    both = sorted([k for k, v in named.items() if not _at_default(v, known[k])] + list(taken))
    if both:
        raise InputError(f"{', '.join(both)} given both as a keyword and in options=")
    return options, forward


def forward_inputs(kwargs: dict, forward_kwargs: dict | None) -> dict:
    """The keyword arguments for the model's forward: those no option of the entry point took, and
    ``forward_kwargs`` (for a forward argument named like an option: ``mode``, ``device``, ``steps``)."""
    if forward_kwargs is None:
        return kwargs
    if not isinstance(forward_kwargs, dict) or not all(isinstance(k, str) for k in forward_kwargs):
        raise InputError(f"forward_kwargs must be a dict of argument names, got {type(forward_kwargs).__name__}")
    both = sorted(set(kwargs) & set(forward_kwargs))
    if both:
        raise InputError(f"{', '.join(both)} given both as a keyword and in forward_kwargs")
    return {**kwargs, **forward_kwargs}


_AUTOCAST = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
             "float16": torch.float16, "half": torch.float16}


def optimizers() -> dict[str, type]:
    return {name.lower(): cls for name, cls in vars(torch.optim).items()
            if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
            and cls is not torch.optim.Optimizer}


def optimizer_factory(optimizer):
    """A callable params -> Optimizer from a class, a factory, an instance (its class and defaults)
    or a name such as "adamw"."""
    if optimizer is None or callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if isinstance(optimizer, torch.optim.Optimizer):
        cls, defaults = type(optimizer), dict(optimizer.defaults)
        return lambda params: cls(params, **defaults)
    if isinstance(optimizer, str):
        table = optimizers()
        cls = table.get(optimizer.lower().replace("-", "").replace("_", ""))
        if cls is None:
            raise InputError(f"unknown optimizer {optimizer!r}; torch.optim has {', '.join(sorted(table))}")
        return cls
    raise InputError(f"optimizer must be a torch.optim class, a factory taking the parameters, an "
                     f"optimizer instance or a name, got {type(optimizer).__name__}")


def parse_autocast(value) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value.lower() in _AUTOCAST:
        return _AUTOCAST[value.lower()]
    raise InputError(f"autocast_dtype must be torch.bfloat16, torch.float16 or one of "
                     f"{', '.join(_AUTOCAST)}, got {value!r}")


def optimizer_name(factory) -> str | None:
    if factory is None:
        return None
    if isinstance(factory, type):
        return factory.__name__
    func = getattr(factory, "func", None)  # functools.partial
    if isinstance(func, type):
        kw = ", ".join(f"{k}={v!r}" for k, v in factory.keywords.items())
        return f"{func.__name__}({kw})"
    return getattr(factory, "__name__", type(factory).__name__)
