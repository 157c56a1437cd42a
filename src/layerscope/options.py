"""Options of the entry points given as names or objects, resolved and checked once: optimizers,
autocast dtypes, and the forward's own keywords kept apart from the options."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

import torch

from .errors import InputError

__all__ = ["Mode", "Causal", "Schedule", "AnalyzeOptions", "MemoryOptions", "ProfileOptions", "forward_inputs",
           "optimizers", "optimizer_factory", "parse_autocast", "optimizer_name"]

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
    """What ``analyze()`` (and ``activations()``) run: checked when made."""

    mode: Mode = "eval"
    backward: bool = False
    causal: Causal = "dense"

    def __post_init__(self) -> None:
        _choice("mode", self.mode, Mode)
        _choice("causal", self.causal, Causal)


@dataclass(frozen=True, slots=True)
class MemoryOptions:
    """The step ``memory()`` simulates: checked, the optimizer and autocast dtype resolved."""

    training: bool = True
    optimizer: Any = None            # a callable params -> Optimizer (from a class, name or instance)
    autocast: torch.dtype | None = None
    steps: int = 2
    accumulation: int = 1
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.steps < 1 or self.accumulation < 1:
            raise InputError("steps and accumulation must be at least 1")
        if self.optimizer is not None and not self.training:
            raise InputError("an optimizer only applies to a training step (training=True)")
        if self.batch_size is not None and self.batch_size < 1:
            raise InputError(f"batch_size must be at least 1, got {self.batch_size}")
        object.__setattr__(self, "optimizer", optimizer_factory(self.optimizer))
        object.__setattr__(self, "autocast", parse_autocast(self.autocast))


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """The timed runs of ``profile()``."""

    warmup: int | str = "auto"
    repeats: int | str = "auto"
    backward: bool = False

    def __post_init__(self) -> None:
        def ok(v, least: int) -> bool:
            return v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= least)
        if not ok(self.warmup, 0) or not ok(self.repeats, 1):
            raise InputError(f"warmup must be >= 0 and repeats >= 1 (or \"auto\"), got {self.warmup!r} and "
                             f"{self.repeats!r}")


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
