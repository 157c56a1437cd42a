"""Freeze what one capture saw into a Trace: the layer records (parameters, buffers, kernels,
subtree sizes) and the model's totals. Parameters and buffers are read after the run."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import nn

from ..errors import InputError
from ..trace import LayerRecord, ParamSpec, Trace
from .inputs import iter_tensors
from .state import held_tensors, unique_tensors
from .tracker import tracked_modules

__all__ = ["ReleasedOutput", "build_trace", "tensor_bytes", "dtype_text", "own_forward", "param_totals"]


def _param_table(modules: list[nn.Module]):
    """How many (module, name) slots hold each param/buffer, and the first module holding it."""
    holders: dict[int, int] = defaultdict(int)
    first_owner: dict[int, int] = {}
    for m in modules:
        for p in m._parameters.values():
            if p is not None:
                holders[id(p)] += 1
                first_owner.setdefault(id(p), id(m))
        for b in m._buffers.values():
            if b is not None:
                holders[id(b)] += 1
                first_owner.setdefault(id(b), id(m))
    return holders, first_owner


def _specs(slots: dict, holders, trainable_default=None, made: dict | None = None) -> tuple[ParamSpec, ...]:
    """ParamSpecs of a module's parameters or buffers. ``made``: specs already made in this build,
    by what fixes one (name, shape, dtype, trainable, shared) -- the blocks of a deep model hold
    the same ones again and again, and a spec is a frozen record."""
    if not slots:      # most modules hold no buffers, and containers and activations no parameters
        return ()
    out = []
    for name, t in slots.items():
        if t is None:
            continue
        trainable = t.requires_grad if trainable_default is None else trainable_default
        shared = holders[id(t)] > 1
        key = None
        if made is not None:
            try:
                key = (name, t.shape, t.dtype, trainable, shared)
                spec = made.get(key)
            except TypeError:     # an unhashable (symbolic) size
                key = spec = None
            if spec is not None:
                out.append(spec)
                continue
        n = int(t.numel())
        spec = ParamSpec(name, tuple(map(int, t.shape)), n, n * t.element_size(), trainable, shared)
        if key is not None:
            made[key] = spec
        out.append(spec)
    return tuple(out)


_NO_KERNEL_ATTR: dict[type, bool] = {}


def _kernel(module: nn.Module):
    cls = type(module)
    plain = _NO_KERNEL_ATTR.get(cls)
    if plain is None:
        # a class with no kernel_size of its own and nn.Module's own attribute lookup: then only the
        # instance can hold one (getattr's miss goes through nn.Module.__getattr__ and an exception,
        # the slow way to learn that a Linear has no kernel)
        plain = _NO_KERNEL_ATTR[cls] = not hasattr(cls, "kernel_size") and cls.__getattr__ is nn.Module.__getattr__
    if plain and "kernel_size" not in module.__dict__ and "kernel_size" not in module._parameters and \
            "kernel_size" not in module._buffers and "kernel_size" not in module._modules:
        return None
    k = getattr(module, "kernel_size", None)
    if k is None:
        return None
    if isinstance(k, int):
        return (k,)
    if isinstance(k, tuple) and all(isinstance(x, int) for x in k):
        return k
    return None


def _subtree_params(model: nn.Module, holders: dict[int, int], modules: list[nn.Module] | None = None) \
        -> dict[int, int]:
    """Unique parameter count of every module's subtree, in one post-order pass. Plain sums are
    exact unless a parameter is shared; only subtrees holding a shared one are recounted.
    ``modules``: ``model``'s modules in pre-order (named_modules' order), where the caller has them:
    walked backwards, every child comes before its parent unless a module sits in the tree twice,
    which the recursive walk below then takes (the same sums; a loop instead of a call a module)."""
    if modules is not None:
        got = _subtree_params_reversed(modules, holders)
        if got is not None:
            return got
    out: dict[int, int] = {}
    shared_below: dict[int, bool] = {}

    def visit(m: nn.Module) -> None:
        if id(m) in out:
            return
        total, shared = 0, False
        for p in m._parameters.values():
            if p is not None:
                total += int(p.numel())
                shared = shared or holders[id(p)] > 1
        for child in m._modules.values():
            if child is not None:
                visit(child)
                total += out[id(child)]
                shared = shared or shared_below[id(child)]
        if shared:
            total = sum(int(p.numel()) for p in m.parameters())
        out[id(m)], shared_below[id(m)] = total, shared

    visit(model)
    return out


def _subtree_params_reversed(modules: list[nn.Module], holders: dict[int, int]) -> dict[int, int] | None:
    """_subtree_params over the pre-order list backwards; None where a child is met before its sums
    (a module reached twice: the recursive walk's case)."""
    out: dict[int, int] = {}
    shared_below: dict[int, bool] = {}
    for m in reversed(modules):
        total, shared = 0, False
        for p in m._parameters.values():
            if p is not None:
                total += int(p.numel())
                shared = shared or holders[id(p)] > 1
        for child in m._modules.values():
            if child is not None:
                t = out.get(id(child))
                if t is None:
                    return None
                total += t
                shared = shared or shared_below[id(child)]
        if shared:
            total = sum(int(p.numel()) for p in m.parameters())
        out[id(m)], shared_below[id(m)] = total, shared
    return out


def _freeze_layers(cap, model: nn.Module, holders, first_owner, modules: list[nn.Module] | None = None):
    subtree = _subtree_params(model, holders, modules)
    layers = []
    called = {id(c.module) for c in cap.calls}
    script = torch.jit.ScriptModule
    made: dict = {}
    for i, c in enumerate(cap.calls):
        m = c.module
        params = _specs(m._parameters, holders, made=made)
        buffers = _specs(m._buffers, holders, trainable_default=False, made=made)
        counted = trainable = 0
        if c.call_index == 0 and (params or isinstance(m, script)):
            # a script module is one layer: it owns the parameters of its whole subtree
            own = _script_subtree_params(m, first_owner, called) if isinstance(m, script) \
                else (p for p in m._parameters.values() if p is not None and first_owner.get(id(p)) == id(m))
            for p in own:
                counted += int(p.numel())
                trainable += int(p.numel()) if p.requires_grad else 0
        # positional, in LayerRecord's field order (index, path, type, depth, call_index, parent,
        # children, inputs, outputs, params, buffers, num_params, trainable_params, subtree_params,
        # kernel_size): keywords cost a dict per record
        layers.append(LayerRecord(
            i, c.path, c.type, c.depth, c.call_index, c.parent, tuple(c.children), c.inputs, c.outputs,
            params, buffers, counted, trainable, subtree.get(id(m), 0), _kernel(m)))
    return layers


def _script_subtree_params(m: nn.Module, first_owner, called: set[int]) -> list[torch.Tensor]:
    """The parameters a script module's layer owns: its own, and those of the submodules inside it
    that are no layer of their own (a scripted child's, run inside TorchScript; the TorchScript
    path records its submodules' calls, and those own their parameters)."""
    inside = {id(sub) for sub in m.modules() if sub is m or id(sub) not in called}
    return [p for p in unique_tensors(m.parameters()) if first_owner.get(id(p)) in inside]



def dtype_text(model: nn.Module, params: list[torch.Tensor] | None = None) -> str | None:
    """The model's parameter dtypes by share of elements: ``bfloat16`` or ``bfloat16 (98.1%), float32``.
    ``params``: ``held_tensors(list(model.modules()), "_parameters")`` where the caller has it (the
    tensors model.parameters() gives, in its order)."""
    by_dtype: dict[torch.dtype, int] = {}
    for p in model.parameters() if params is None else params:   # each tensor once (parameters() drops repeats)
        by_dtype[p.dtype] = by_dtype.get(p.dtype, 0) + p.numel()
    counts = {str(d).removeprefix("torch."): n for d, n in by_dtype.items()}
    if not counts:
        return None
    total = sum(counts.values()) or 1
    order = sorted(counts, key=counts.get, reverse=True)
    if len(order) == 1:
        return order[0]
    return f"{order[0]} ({100 * counts[order[0]] / total:.1f}%), " + ", ".join(order[1:])


def param_totals(module: nn.Module) -> tuple[int, int, int]:
    """(parameters, trainable parameters, parameter bytes) of the distinct tensors ``module`` holds,
    tied ones once: the sums ``build_trace`` makes (a Report's ``totals.params``, ``trainable_params``,
    ``param_bytes``), for front ends where no forward ran and for a submodule's own count."""
    numel = trainable = nbytes = 0
    for p in held_tensors(list(module.modules()), "_parameters"):
        if isinstance(p, nn.parameter.UninitializedParameter):
            continue            # a lazy module's before its first forward: no elements yet
        n = int(p.numel())
        numel += n
        nbytes += n * p.element_size()
        if p.requires_grad:
            trainable += n
    return numel, trainable, nbytes


def tensor_bytes(obj: Any) -> int:
    """The bytes of the tensors in a model's inputs or output (each once)."""
    return sum(t.numel() * t.element_size() for t in unique_tensors(iter_tensors(obj)))


class ReleasedOutput:
    """What a training step remembers of a model output it let go of before the backward: its bytes."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def build_trace(cap, model: nn.Module, named: list[tuple[str, nn.Module]], inputs: Any,
                output: Any, *, backward: bool, options: dict) -> Trace:
    """Freeze what one capture saw into a Trace (its options say the model's dtypes too). ``named``
    is ``list(model.named_modules())``. Parameters and buffers are read now, after the run: a forward
    may register a buffer (a cache made on first use)."""
    modules = [m for _, m in named]
    params = held_tensors(modules, "_parameters")
    buffers = held_tensors(modules, "_buffers")
    # an eager module's parameters() are these, in this order; a script module lists its own
    options = {**options, "model_dtype": options["model_dtype"] if "model_dtype" in options
               else dtype_text(model, None if isinstance(model, torch.jit.ScriptModule) else params)}
    holders, first_owner = _param_table(modules)
    layers = _freeze_layers(cap, model, holders, first_owner,
                            modules if named and named[0][1] is model else None)
    if not layers:
        raise InputError("the model's forward never ran as a module call; nothing to analyse")
    # containers without a forward of their own (ModuleList, ModuleDict) are never called by design
    uncalled = tuple(p or "(root)" for p, m in tracked_modules(named)
                     if cap.ncalls.get(id(m), 0) == 0 and own_forward(m))
    # the parameters' and buffers' sums in one pass each (each tensor's numel read once)
    p_numel = p_trainable = p_shared = p_bytes = 0
    for p in params:
        n = int(p.numel())
        p_numel += n
        if p.requires_grad:
            p_trainable += n
        if holders[id(p)] > 1:
            p_shared += n
        p_bytes += n * p.element_size()
    b_numel = b_bytes = 0
    for b in buffers:
        n = int(b.numel())
        b_numel += n
        b_bytes += n * b.element_size()
    in_bytes = tensor_bytes(inputs)
    out_bytes = output.nbytes if isinstance(output, ReleasedOutput) else tensor_bytes(output)
    return Trace(
        model_name=type(model).__name__,
        layers=tuple(layers),
        ops=tuple(cap.ops),
        layer_outputs=tuple(c.output_producers for c in cap.calls),
        param_numel=p_numel, trainable_numel=p_trainable, shared_numel=p_shared, param_bytes=p_bytes,
        buffer_numel=b_numel, buffer_bytes=b_bytes,
        input_bytes=in_bytes, output_bytes=out_bytes, uncalled_modules=uncalled, backward=backward,
        options=options,
    )


def own_forward(m: nn.Module) -> bool:
    """Whether the module defines a forward (a ModuleList does not); script modules say so in C++."""
    if isinstance(m, torch.jit.ScriptModule):
        return m._c._has_method("forward")
    return type(m).forward is not nn.Module.forward
