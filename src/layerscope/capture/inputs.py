"""Example inputs: build them from sizes, and walk nested inputs/outputs for their tensors."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Iterator

import torch

from ..errors import InputError
from ..trace import TensorSpec

__all__ = ["make_inputs", "check_shape", "iter_tensors", "tensor_specs", "SpecCache", "map_tensors", "meta_copies", "dtype_name"]

_MAX_DEPTH = 32


def iter_tensors(obj: Any, _depth: int = 0) -> Iterator[torch.Tensor]:
    """Every tensor inside args/kwargs/outputs of any nesting: lists, tuples, dicts (transformers'
    ModelOutput is one), dataclasses and namedtuples."""
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if _depth > _MAX_DEPTH or obj is None or isinstance(obj, (str, bytes, int, float, bool)):
        return
    if isinstance(obj, Mapping):
        for v in obj.values():
            yield from iter_tensors(v, _depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from iter_tensors(v, _depth + 1)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from iter_tensors(getattr(obj, f.name, None), _depth + 1)


def map_tensors(obj: Any, fn, _depth: int = 0, leaf: type = torch.Tensor) -> Any:
    """Rebuild a nested structure with fn applied to each tensor (containers of the same kind);
    ``leaf``: the type fn takes, when it is not tensors (capture/blocks.py rebuilds an output from
    the specs of its tensors)."""
    if isinstance(obj, leaf):
        return fn(obj)
    if _depth > _MAX_DEPTH:
        return obj
    if isinstance(obj, Mapping):
        new = {k: map_tensors(v, fn, _depth + 1, leaf) for k, v in obj.items()}
        if type(obj) is dict:
            return new
        try:  # OrderedDict, transformers' ModelOutput, ...
            return obj.__class__(**new)
        except TypeError:
            return new
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return obj.__class__(*(map_tensors(v, fn, _depth + 1, leaf) for v in obj))
    if isinstance(obj, (list, tuple)):
        return obj.__class__(map_tensors(v, fn, _depth + 1, leaf) for v in obj)
    return obj


_DTYPE_NAMES = {d: str(d).replace("torch.", "") for d in
                (getattr(torch, n) for n in dir(torch)) if isinstance(d, torch.dtype)}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype) or str(dtype).replace("torch.", "")


def tensor_specs(obj: Any) -> tuple[TensorSpec, ...]:
    return tuple(_spec(t) for t in iter_tensors(obj))


def _spec(t: torch.Tensor) -> TensorSpec:
    return TensorSpec(tuple(t.shape), dtype_name(t.dtype), t.numel() * t.element_size())


class SpecCache:
    """tensor_specs for one run, each TensorSpec made once per (shape, dtype): a spec is a frozen
    record fixed by the two (numel is the product of the shape), and a model's calls see the same
    few again and again. Shapes that cannot be a key (symbolic sizes) are made each time."""

    __slots__ = ("known",)

    def __init__(self) -> None:
        self.known: dict = {}

    def of(self, tensors) -> tuple[TensorSpec, ...]:
        known = self.known
        out = []
        for t in tensors:
            try:
                key = (t.shape, t.dtype)
                spec = known.get(key)
            except TypeError:      # an unhashable (symbolic) size
                out.append(_spec(t))
                continue
            if spec is None:
                spec = known[key] = _spec(t)
            out.append(spec)
        return tuple(out)

    def of_call(self, args: tuple, kwargs: dict) -> tuple[TensorSpec, ...]:
        """tensor_specs((args, kwargs)), without the generators where an argument is a tensor."""
        ts: list = []
        for a in args:
            if isinstance(a, torch.Tensor):
                ts.append(a)
            else:
                ts.extend(iter_tensors(a, 2))     # the depth iter_tensors((args, kwargs)) gives it
        if kwargs:
            for v in kwargs.values():
                if isinstance(v, torch.Tensor):
                    ts.append(v)
                else:
                    ts.extend(iter_tensors(v, 2))
        return self.of(ts)


def _as_sizes(input_size: Any) -> list[tuple[int, ...]]:
    """Normalise input_size to a list of shapes: (1, 3, 224, 224) or [(1, 16), (1, 16)]."""
    if isinstance(input_size, torch.Size):
        return [tuple(input_size)]
    if isinstance(input_size, Sequence) and not isinstance(input_size, str) and input_size:
        if all(isinstance(s, int) for s in input_size):
            return [tuple(int(s) for s in input_size)]
        if all(isinstance(s, (Sequence, torch.Size)) and not isinstance(s, str) for s in input_size):
            out = []
            for s in input_size:
                if not all(isinstance(d, int) for d in s):
                    break
                out.append(tuple(int(d) for d in s))
            else:
                return out
    raise InputError(f"input_size must be a shape like (1, 3, 224, 224) or a list of shapes, got {input_size!r}")


def check_shape(shape: tuple[int, ...], what: str = "input size") -> None:
    """A shape example inputs are built with: no negative and no zero dimension. An empty tensor runs
    through most layers and every count comes out 0: a table of zeros that looks like an answer
    (``what``: how the caller names it, e.g. "input ids" for the CLI's --input-ids)."""
    shape = tuple(shape)
    if any(s < 0 for s in shape):
        raise InputError(f"{what} {shape} has a negative dimension")
    if any(s == 0 for s in shape):
        raise InputError(f"{what} {shape} has a zero dimension: every count would be 0")


def make_inputs(input_size: Any, dtypes: Any = None, batch_dim: int | None = None,
                device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """Example tensors for ``input_size`` (torchinfo's convention).

    Floating inputs are standard normal, integer inputs are 0 or 1 (valid token ids for any vocabulary
    and valid masks), drawn from a private generator so the global RNG state is untouched. On the meta
    device nothing is allocated. ``batch_dim`` inserts a batch dimension of size 1 at that index.
    """
    sizes = _as_sizes(input_size)
    if dtypes is None:
        dtypes = [torch.float32] * len(sizes)
    elif isinstance(dtypes, torch.dtype):
        dtypes = [dtypes] * len(sizes)
    dtypes = list(dtypes)
    if len(dtypes) != len(sizes):
        raise InputError(f"dtypes has {len(dtypes)} entries but input_size describes {len(sizes)} inputs")
    for d in dtypes:
        if not isinstance(d, torch.dtype):
            raise InputError(f"dtypes must be torch dtypes, got {d!r}")
    device = torch.device(device)
    out = []
    gen = None if device.type == "meta" else torch.Generator(device=device).manual_seed(0)
    for shape, dtype in zip(sizes, dtypes):
        check_shape(shape)
        if batch_dim is not None:
            shape = shape[:batch_dim] + (1,) + shape[batch_dim:]
        if device.type == "meta":
            out.append(torch.empty(shape, dtype=dtype, device=device))
        elif dtype.is_floating_point or dtype.is_complex:
            out.append(torch.randn(shape, dtype=dtype, device=device, generator=gen))
        elif dtype == torch.bool:
            out.append(torch.randint(0, 2, shape, device=device, generator=gen).bool())
        else:
            out.append(torch.randint(0, 2, shape, dtype=dtype, device=device, generator=gen))
    return out


def meta_copies(obj: Any) -> Any:
    """Meta copies of the tensors in args/kwargs (shapes, dtypes and a floating tensor's requires_grad
    kept, nothing held alive); dicts, lists and plain tuples rebuilt, anything else as it is."""
    if isinstance(obj, torch.Tensor):
        copy = torch.empty_like(obj, device="meta")
        return copy.requires_grad_(obj.requires_grad) if obj.is_floating_point() or obj.is_complex() else copy
    if isinstance(obj, dict):
        return {k: meta_copies(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
        return type(obj)(meta_copies(v) for v in obj)
    return obj
