"""What a run may change in a model, and how it is put back: the StateGuard (train/eval flags,
requires_grad, .grad, buffers such as BatchNorm statistics, the RNG state, restored also when the
model raises), the model's mode, swapped-in parameters and buffers, and a private generator for
random ops."""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

from .. import _compat
from .inputs import iter_tensors, map_tensors
from .rng import PrivateRNG

__all__ = ["StateGuard", "model_device", "describe_inputs", "private_rng", "swapped_state", "empty_like_on",
           "empty_state", "grad_inputs", "non_leaf", "set_mode", "held_tensors", "unique_tensors"]


def model_device(model: nn.Module) -> torch.device:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


def describe_inputs(specs) -> str:
    if not specs:
        return "no tensors"
    return ", ".join(f"Tensor{list(s.shape)} {s.dtype}" for s in specs)


class StateGuard:
    """Snapshot of what a run may change in a model; ``restore()`` puts every piece back."""

    def __init__(self, model: nn.Module, modules: list[nn.Module] | None = None,
                 inputs: Any = None, params: list[torch.Tensor] | None = None) -> None:
        """``params``: ``held_tensors(modules, "_parameters")`` where the caller has it already."""
        modules = list(model.modules()) if modules is None else modules
        self.modes = [(m, m.training) for m in modules]
        # parameters, and input tensors a backward would accumulate a .grad into
        if params is None:
            params = held_tensors(modules, "_parameters")
        leaves = params + [t for t in unique_tensors(iter_tensors(inputs)) if t.is_leaf and t.requires_grad]
        self.params = [(p, p.requires_grad, p.grad) for p in unique_tensors(leaves)]
        self.buffers = []
        for m in modules:
            for name, b in m._buffers.items():
                if b is not None:
                    self.buffers.append((m, name, b, b.detach().clone()))
        self.rng = torch.get_rng_state()
        self.cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and \
            torch.cuda.is_initialized() else None

    def restore(self, rng: bool = True) -> None:
        """``rng=False`` leaves torch's global generators alone: a run whose random ops all drew from
        a private generator (capture/rng.py) never advanced them, and setting them back would rewind
        the draws other threads made meanwhile."""
        for m, training in self.modes:
            if m.training is not training:   # nn.Module.__setattr__ is slow, and most flags never moved
                _set_training(m, training)
        for p, requires_grad, grad in self.params:
            if p.requires_grad != requires_grad:
                p.requires_grad_(requires_grad)
            p.grad = grad
        with torch.no_grad():
            for m, name, b, saved in self.buffers:
                if (m._buffers[name] if name in m._buffers else None) is not b:   # script modules too
                    m._buffers[name] = b
                if b.device.type != "meta":
                    # a buffer made under inference mode can be written only inside it
                    with torch.inference_mode() if b.is_inference() else contextlib.nullcontext():
                        b.copy_(saved)
        if not rng:
            return
        torch.set_rng_state(self.rng)
        if self.cuda_rng is not None:
            torch.cuda.set_rng_state_all(self.cuda_rng)


@_compat.dispatch_mode
class _PrivateRngMode:
    """Only hands random ops the private generator (no recording)."""

    def __init__(self, rng: PrivateRNG) -> None:
        super().__init__()
        self.rng = rng

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if torch.Tag.nondeterministic_seeded in func.tags:
            return self.rng.call(func, args, kwargs)
        return func(*args, **kwargs)


@contextlib.contextmanager
def private_rng():
    """Run a real forward with its random draws from a private generator (capture/rng.py). Yields
    the PrivateRNG: restore the global state afterwards only if ``touched_global``."""
    rng = PrivateRNG()
    with _PrivateRngMode(rng):
        yield rng


def swapped_state(model: nn.Module, state: dict[str, torch.Tensor] | None):
    """Run the model with other tensors in place of its parameters and buffers (what
    torch.func.functional_call does), for as long as the context lasts: through backward too, so
    that activation checkpointing recomputes with the swapped tensors, not the model's own."""
    if state is None:
        return contextlib.nullcontext()
    return _swapped(model, state)


@contextlib.contextmanager
def _swapped(model: nn.Module, state: dict[str, torch.Tensor]):
    # torch's reparametrize_module puts back what it swapped under each name, but a module reached
    # under several names (one submodule shared by many blocks) kept the swapped-in tensor: every slot is
    # put back here as it was
    slots = [(m, d, name, t) for m in model.modules() for d in (m._parameters, m._buffers) if type(d) is dict
             for name, t in d.items()]     # (a script module's are its own: torch's wrapper of C++ slots)
    try:
        with _compat.reparametrize_module(model, state, tie_weights=True, strict=False):
            yield
    finally:
        for _, d, name, t in slots:
            if d.get(name) is not t:
                d[name] = t


def empty_like_on(t: torch.Tensor, device) -> torch.Tensor:
    """A tensor with ``t``'s shape, strides and dtype on ``device``, and nothing in it (on meta, or
    under a FakeTensorMode, nothing is allocated). A leaf that requires grad stays one."""
    out = torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device)
    return out.requires_grad_(t.requires_grad) if t.is_leaf and t.requires_grad else out


def empty_state(model: nn.Module, device) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Empty copies of the model's parameters and of its buffers, by name, one entry per tensor:
    swapped_state (tie_weights=True) feeds tied names from it."""
    params = {name: empty_like_on(p, device) for name, p in model.named_parameters()}
    buffers = {name: empty_like_on(b, device) for name, b in model.named_buffers()}
    return params, buffers


class _Alias(torch.autograd.Function):
    """The identity, as an autograd node: its output shares the input's storage but is neither a leaf
    nor a view, and its backward hands the gradient through unchanged (no aten op runs)."""

    @staticmethod
    def forward(ctx, x):   # noqa: ARG004 (autograd's signature)
        return x.detach()

    @staticmethod
    def backward(ctx, grad):   # noqa: ARG004
        return grad


def non_leaf(leaf: torch.Tensor) -> torch.Tensor:
    """``leaf`` (which requires grad) seen through one identity node: the tensor a model receives where
    the caller passed a non-leaf. It accepts in-place ops as the caller's non-leaf did (``relu_`` on a
    leaf that requires grad raises; issue 34), and a backward still reaches ``leaf.grad``. Same storage:
    an in-place op writes into the caller's tensor, as calling the model directly does."""
    return _Alias.apply(leaf)


def grad_inputs(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The inputs a backward run is given, so that it differentiates the model and nothing else: an
    input that requires grad but is not a leaf (the output of the caller's own graph) becomes a
    detached leaf that requires grad, passed through ``non_leaf`` so that in-place ops on it work as
    on the caller's tensor -- the model's input-gradient work is counted as for a leaf,
    and the caller's graph is neither run backward (its ops recorded as the model's) nor freed, nor
    its leaves' .grad touched. Other inputs are passed as they are; aliases stay aliases."""
    seen: dict[int, torch.Tensor] = {}

    def fix(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in seen:
            seen[id(t)] = non_leaf(t.detach().requires_grad_()) if t.requires_grad and not t.is_leaf else t
        return seen[id(t)]

    if not any(t.requires_grad and not t.is_leaf for t in iter_tensors((args, kwargs))):
        return args, kwargs
    return map_tensors(tuple(args), fix), map_tensors(dict(kwargs), fix)


_TRAIN, _EVAL = nn.Module.train, nn.Module.eval


_SETATTR = nn.Module.__setattr__


def _set_training(m: nn.Module, training: bool) -> None:
    """``m.training = training``. nn.Module.__setattr__ checks the name against the module's
    parameters, submodules and buffers (``training`` can be none of them: register_* refuse a name
    that is already an attribute) and then sets it as object.__setattr__ does: that, in one C call,
    for a class that keeps nn.Module's __setattr__."""
    if type(m).__setattr__ is _SETATTR:
        object.__setattr__(m, "training", training)
    else:
        m.training = training


def set_mode(model: nn.Module, modules: list[nn.Module], training: bool) -> None:
    """``model.train(training)``. Where no module overrides train(), eval() or __setattr__,
    nn.Module.train only sets every module's flag (``modules`` is ``model.modules()``, the modules its
    recursion reaches): the flags are set directly, and only those that change (most are in that
    mode already)."""
    plain = True
    for m in modules:
        cls = type(m)
        if cls.train is not _TRAIN or cls.eval is not _EVAL or cls.__setattr__ is not _SETATTR:
            plain = False
            break
    if not plain:
        if training:
            model.train()
        else:
            model.eval()
        return
    for m in modules:
        if m.training is not training:
            object.__setattr__(m, "training", training)



def held_tensors(modules: list[nn.Module], slot: str) -> list[torch.Tensor]:
    """The distinct tensors the modules hold directly in ``slot`` ("_parameters" or "_buffers")."""
    out, seen = [], set()
    for m in modules:                      # unique_tensors over the slots, as plain loops (no generators)
        for t in getattr(m, slot).values():
            if t is not None and id(t) not in seen:
                seen.add(id(t))
                out.append(t)
    return out


def unique_tensors(tensors):
    """Each tensor once, by identity, in order."""
    seen = set()
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            yield t
