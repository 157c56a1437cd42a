"""Small shape helpers shared by the cost formulas."""

from __future__ import annotations

import math

import torch


def is_tensor(x) -> bool:
    return isinstance(x, torch.Tensor)


def numel(t: torch.Tensor) -> int:
    return int(t.numel())


def nbytes(t: torch.Tensor) -> int:
    return int(t.numel()) * t.element_size()


def shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(map(int, t.shape))


def prod(xs) -> int:
    return int(math.prod(map(int, xs)))


def tup(v, n: int) -> tuple[int, ...]:
    """Expand an int-or-list argument (kernel, stride, ...) to n entries."""
    if v is None:
        return (1,) * n
    if isinstance(v, (list, tuple)):
        if len(v) == 0:
            return (1,) * n
        if len(v) == 1:
            return (int(v[0]),) * n
        return tuple(int(x) for x in v)
    return (int(v),) * n


def tensors_in(args) -> list[torch.Tensor]:
    """Tensor leaves of an op's arguments (top level and one level of lists, as aten schemas allow)."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, (list, tuple)):
            out.extend(x for x in a if isinstance(x, torch.Tensor))
    return out
