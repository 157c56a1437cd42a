"""torch ParallelStyles for what transformers' TP plan styles do and torch's own styles do not
(planning/tp_plans.py maps each plan entry onto torch's ColwiseParallel, RowwiseParallel and
SequenceParallel where those fit, onto these where they do not).

Each is a ``torch.distributed.tensor.parallel.ParallelStyle`` applied by ``parallelize_module`` on the tp
mesh, built from DTensor operations only (``from_local``, ``redistribute``, ``to_local``), so that the
simulation records their collectives as it records torch's styles' (no ``dist.all_reduce`` of their own):

- ``GatherHidden``: torch's ``PrepareModuleInput`` (Shard(1) -> Replicate, the result left a DTensor) for
  an attention or MLP called with its hidden states either first or as the ``hidden_states`` keyword
  (torch's style needs to be told which; the blocks of transformers' models differ).
- ``LocalParams``: transformers' ``replicated_with_grad_allreduce`` (``partial_grad``: Qwen3's per-head
  ``q_norm``/``k_norm``, which see this rank's heads only, so the ranks' weight gradients are summed) and
  the plain replication transformers leaves to a module no plan entry names (a MoE router, Olmo2's
  ``q_norm`` on gathered heads): the parameters replicated DTensors on the tp mesh (FSDP2 and the
  optimizer then see one kind of parameter), the forward run on local tensors.
- ``ExpertsTP``: transformers' ``moe_tp_experts`` with its parameters' ``packed_colwise`` (a fused
  [gate | up] 3-D weight: gate's and up's output rows each split across the ranks, torch's strided shard)
  and ``rowwise`` (the down weight's input columns split): each rank runs its slice of every expert, the
  input's gradient and the routing weights' gradients summed over the ranks, the output summed forward.
- ``LocalBlock``: a module run on local tensors (a MoE block: its router, experts and the sums between them)
  inside the DTensor residual stream: its hidden states gathered and made local (their gradient is whole on
  every rank: the experts' and the router's parts are summed or replicated), its output handed back as the
  DTensor the residual stream is (replicated, or sharded on the sequence under sequence parallel).
"""

from __future__ import annotations

from torch import nn

from .. import _compat
from ..capture import hooks

__all__ = ["tp_styles"]


def _all_reduce_backward(x, mesh):
    """``x`` unchanged forward; its gradient summed over the tp ranks backward (transformers'
    ``_AllReduceBackward``): a replicated DTensor read as local with a partial gradient, which
    ``from_local``'s backward reduces to the replicated one."""
    from torch.distributed.tensor import DTensor, Partial, Replicate
    return DTensor.from_local(x, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


def _all_reduce_forward(x, mesh):
    """The ranks' partial ``x`` summed forward; the gradient passed through unchanged backward (each rank's
    partial output contributes to the sum with weight one)."""
    from torch.distributed.tensor import DTensor, Partial, Replicate
    return DTensor.from_local(x, mesh, [Partial()], run_check=False).redistribute(placements=[Replicate()]).to_local()


def _to_local(x):
    """A DTensor input made local (replicated first: what a module running on local tensors reads)."""
    from torch.distributed.tensor import DTensor, Replicate
    if isinstance(x, DTensor):
        if any(not p.is_replicate() for p in x.placements):
            x = x.redistribute(placements=[Replicate()] * len(x.placements))
        return x.to_local()
    return x


class _Swap:
    """The module's parameters swapped for local tensors around its forward (forward pre-hook and hook),
    restored after it; taken at each call, as FSDP2 sets the unsharded parameters before the block runs."""

    def __init__(self, local_of) -> None:
        self.local_of = local_of
        self.stash: list[dict] = []

    def pre(self, module, args, kwargs):
        saved = dict(module._parameters)
        self.stash.append(saved)
        for name, p in saved.items():
            if p is not None:
                module._parameters[name] = self.local_of(name, p)
        return None

    def post(self, module, args, kwargs, output):
        module._parameters.update(self.stash.pop())
        return None


def tp_styles():
    """The style classes (built on first use: torch.distributed's tensor package is imported only where
    tensor parallel runs)."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import ParallelStyle, PrepareModuleInput

    class GatherHidden(PrepareModuleInput):
        def __init__(self, seq) -> None:
            super().__init__(input_layouts=(seq,), desired_input_layouts=(Replicate(),))
            self.seq = seq

        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            def hook(_mod, args, kwargs):
                if args:
                    first = self._prepare_input_arg(args[0], device_mesh, self.seq, Replicate())
                    return (first, *args[1:]), kwargs
                if "hidden_states" in kwargs:
                    kwargs = {**kwargs, "hidden_states": self._prepare_input_arg(
                        kwargs["hidden_states"], device_mesh, self.seq, Replicate())}
                return args, kwargs
            hooks.forward_pre_hook(module, hook, with_kwargs=True)
            return module

    def replicate_params(name_in_style, module, mesh):
        # the styled module's own parameters only (distribute_module calls this for every submodule); the
        # model is built alike on every rank (same seed), as torch's SequenceParallel assumes
        if name_in_style:
            return
        for name, p in list(module.named_parameters(recurse=False)):
            module.register_parameter(name, nn.Parameter(DTensor.from_local(p, mesh, [Replicate()], run_check=False),
                                                         requires_grad=p.requires_grad))

    class LocalParams(ParallelStyle):
        def __init__(self, partial_grad: bool = False) -> None:
            super().__init__()
            self.partial_grad = partial_grad

        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            def local_of(_name, p):
                local = p.to_local() if isinstance(p, DTensor) else p
                return _all_reduce_backward(local, device_mesh) if self.partial_grad else local
            distribute_module(module, device_mesh, replicate_params)
            swap = _Swap(local_of)
            hooks.forward_pre_hook(
                module, lambda m, a, k: (tuple(_to_local(x) for x in a), {n: _to_local(v) for n, v in k.items()}),
                with_kwargs=True)
            hooks.forward_pre_hook(module, swap.pre, with_kwargs=True)
            hooks.forward_hook(module, swap.post, with_kwargs=True, always_call=True)
            return module

    class ExpertsTP(ParallelStyle):
        def __init__(self, params: dict[str, str]) -> None:
            super().__init__()
            self.params = params          # parameter name -> transformers' style: packed_colwise or rowwise

        def _placement(self, name: str, ndim: int):
            strided = _compat.need("StridedShard", "tensor parallel of packed expert weights")
            if self.params[name] == "packed_colwise":
                # [E, 2I, H]: rows [gate | up]; a rank keeps I / tp rows of each (transformers' PackedColwise)
                return Shard(ndim - 1) if ndim == 1 else strided(dim=ndim - 2, split_factor=2)
            return Replicate() if ndim == 1 else Shard(ndim - 1)     # rowwise: [E, H, I] on I

        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            def shard(name_in_style, mod, mesh):
                if name_in_style:     # the experts' own parameters only (distribute_module walks every submodule)
                    return
                for name, p in list(mod.named_parameters(recurse=False)):
                    mod.register_parameter(name, nn.Parameter(
                        distribute_tensor(p, mesh, [self._placement(name, p.ndim)], src_data_rank=None),
                        requires_grad=p.requires_grad))

            def inputs(_mod, args, kwargs):
                # (hidden_states, top_k_index, top_k_weights): each rank's slice of every expert makes partial
                # gradients of the hidden states and of the routing weights, summed over the ranks
                hidden = _all_reduce_backward(_to_local(args[0]), device_mesh)
                rest = [_to_local(a) for a in args[1:]]
                if len(rest) >= 2 and rest[1].is_floating_point():
                    rest[1] = _all_reduce_backward(rest[1], device_mesh)
                return (hidden, *rest), kwargs

            distribute_module(module, device_mesh, shard)
            swap = _Swap(lambda _n, p: p.to_local() if isinstance(p, DTensor) else p)
            hooks.forward_pre_hook(module, inputs, with_kwargs=True)
            hooks.forward_pre_hook(module, swap.pre, with_kwargs=True)
            hooks.forward_hook(module, swap.post, with_kwargs=True, always_call=True)
            hooks.forward_hook(module, lambda m, a, out: _all_reduce_forward(out, device_mesh))
            return module

    class LocalBlock(ParallelStyle):
        def __init__(self, seq) -> None:
            super().__init__()
            self.seq = seq

        def _apply(self, module: nn.Module, device_mesh) -> nn.Module:
            def gather(x):
                if not isinstance(x, DTensor):
                    return x
                return x.redistribute(placements=[Replicate()]).to_local() if x.placements != (Replicate(),) \
                    else x.to_local()

            def inp(_mod, args, kwargs):
                if args:
                    return (gather(args[0]), *args[1:]), kwargs
                if "hidden_states" in kwargs:
                    return args, {**kwargs, "hidden_states": gather(kwargs["hidden_states"])}
                return args, kwargs

            def out(_mod, _args, output):
                first = output[0] if isinstance(output, tuple) else output
                if not isinstance(first, DTensor):
                    first = DTensor.from_local(first, device_mesh, [Replicate()], run_check=False)
                if first.placements != (self.seq,):
                    first = first.redistribute(placements=[self.seq])
                return (first, *output[1:]) if isinstance(output, tuple) else first
            hooks.forward_pre_hook(module, inp, with_kwargs=True)
            hooks.forward_hook(module, out)
            return module

    return GatherHidden, LocalParams, ExpertsTP, LocalBlock

