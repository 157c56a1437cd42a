"""Random draws of a recorded run come from a private generator, never from torch's global one.

torch's default CPU (and per-device CUDA) generator is one per process. Restoring it after a run
(``torch.set_rng_state``) rewinds the stream of every other thread that drew from it meanwhile (a
user thread drawing during 20 analyses got 26,380 distinct values out of 179,269 draws). So the op
recorder hands each random op a generator of its own, started from a copy of the global state at
the first draw: the run draws what a real run would draw on its own, and the global generator is
never advanced and never set.

* An op with a ``generator`` argument gets the private one; a ``.default`` overload without one
  (``rand``, ``randn``, ``randint``, ``rand_like``...) goes to its ``generator`` sibling.
* ``native_dropout`` (the kernel behind ``nn.Dropout``; it has no generator argument) is computed as
  its CPU kernel does: a Bernoulli(1 - p) mask from the private generator, times 1 / (1 - p).
* Any other seeded op that would draw (fused attention with ``dropout_p > 0`` in training, cuDNN RNN
  dropout) draws from the global generator: ``touched_global`` is then set and the caller restores
  the global state afterwards, as before.
"""

from __future__ import annotations

import torch

__all__ = ["PrivateRNG"]

_SEEDED = torch.Tag.nondeterministic_seeded
_NATIVE_DROPOUT = torch.ops.aten.native_dropout.default
_DROP_NAMES = ("dropout_p", "dropout", "p")
_TRAIN_NAMES = ("train", "training")
_siblings: dict = {}


def _names(op) -> list[str]:
    return [a.name for a in op._schema.arguments]


def _with_generator(op):
    """(overload to call, whether it takes ``generator``): ``op`` itself, its generator sibling, or
    (None, False) when neither exists."""
    hit = _siblings.get(op)
    if hit is None:
        names = _names(op)
        if "generator" in names:
            hit = (op, True)
        else:
            packet = getattr(torch.ops.aten, op._opname, None) if op.namespace == "aten" else None
            hit = (None, False)
            for name in packet.overloads() if packet is not None else ():
                other = getattr(packet, name)
                theirs = _names(other)
                if "generator" in theirs and [n for n in theirs if n != "generator"] == names:
                    hit = (other, True)
                    break
        _siblings[op] = hit
    return hit


def _would_draw(op, args, kwargs) -> bool:
    """Whether a seeded op without a generator argument draws at all: a dropout probability of 0
    or train=False means it does not (SDPA kernels run with dropout_p=0 outside training)."""
    values = dict(zip(_names(op), args))
    values.update(kwargs)
    p = next((values[n] for n in _DROP_NAMES if n in values), None)
    train = next((values[n] for n in _TRAIN_NAMES if n in values), True)
    return not (p is not None and (not p or train is False))


def _device(args, kwargs) -> torch.device:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.device
    dev = kwargs.get("device")
    return torch.device(dev) if dev is not None else torch.device("cpu")


class PrivateRNG:
    """Generators for one run, one per device, each a copy of the global state at its first use."""

    def __init__(self) -> None:
        self.generators: dict[torch.device, torch.Generator] = {}
        self.touched_global = False

    def generator(self, device: torch.device) -> torch.Generator | None:
        if device.type not in ("cpu", "cuda"):
            return None
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        g = self.generators.get(device)
        if g is None:
            g = torch.Generator(device)
            g.set_state(torch.get_rng_state() if device.type == "cpu" else torch.cuda.get_rng_state(device))
            self.generators[device] = g
        return g

    def call(self, func, args, kwargs):
        """Run ``func`` (a seeded op, below every mode) with the private generator."""
        g = self.generator(_device(args, kwargs))
        if g is None:                       # meta and other devices draw nothing
            return func(*args, **kwargs)
        if func is _NATIVE_DROPOUT:
            return _native_dropout(g, *args, **kwargs)
        op, takes = _with_generator(func)
        if takes:
            if kwargs.get("generator") is not None:     # the model brought its own generator
                return func(*args, **kwargs)
            return op(*args, **{**kwargs, "generator": g})
        if _would_draw(func, args, kwargs):
            self.touched_global = True
        return func(*args, **kwargs)


def _native_dropout(g: torch.Generator, input: torch.Tensor, p: float, train: bool | None):
    """aten.native_dropout as its CPU kernel computes it, drawing the mask from ``g``."""
    if train is False or not input.numel():
        return input.clone(), torch.ones_like(input, dtype=torch.bool)
    if p >= 1:
        return torch.zeros_like(input), torch.zeros_like(input, dtype=torch.bool)
    mask = torch.empty_like(input).bernoulli_(1 - p, generator=g).to(torch.bool)
    return input * mask * (1.0 / (1 - p)), mask
