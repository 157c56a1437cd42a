"""Collectives (torch.distributed's c10d ops and its functional collectives): no arithmetic. Bytes are the
collective's payload as the op sees it on one rank: ``bytes_read`` what this rank contributes, and
``bytes_written`` what it receives:

* all-gather: reads its shard, writes the gathered tensor (group size x shard);
* reduce-scatter: reads the full tensor, writes its shard (the sum of its slice over the group);
* all-reduce: reads and writes the tensor;
* all-to-all: reads and writes its input's and output's bytes; broadcast: reads and writes the tensor.

A ring moves (n - 1) / n of the gathered (or reduced) tensor through each rank for an all-gather or a
reduce-scatter, and twice that for an all-reduce (parallel/ prices the links). ``wait_tensor`` is free.
Reductions' additions (n - 1 per element) are not counted as FLOPs: the network does them in NCCL's
kernels, outside the model's arithmetic.
"""

from __future__ import annotations

from ._util import nbytes, tensors_in
from .registry import OpCall, OpCost, register, register_free


def _tensors(x) -> list:
    return list(tensors_in(x if isinstance(x, (list, tuple)) else (x,)))


@register("c10d::_allgather_base_", "c10d::allgather_into_tensor_coalesced_")
def all_gather_inplace(c: OpCall) -> OpCost:
    out, inp = _tensors(c.args[0]), _tensors(c.args[1])
    return OpCost(0, 0, bytes_read=sum(map(nbytes, inp)), bytes_written=sum(map(nbytes, out)))


@register("c10d::_reduce_scatter_base_", "c10d::reduce_scatter_tensor_coalesced_")
def reduce_scatter_inplace(c: OpCall) -> OpCost:
    out, inp = _tensors(c.args[0]), _tensors(c.args[1])
    return OpCost(0, 0, bytes_read=sum(map(nbytes, inp)), bytes_written=sum(map(nbytes, out)))


@register("c10d::allreduce_", "c10d::broadcast_", "_c10d_functional::all_reduce_")
def all_reduce_inplace(c: OpCall) -> OpCost:
    n = sum(map(nbytes, _tensors(c.args[0])))
    return OpCost(0, 0, bytes_read=n, bytes_written=n)


@register("_c10d_functional::all_gather_into_tensor", "_c10d_functional::reduce_scatter_tensor",
          "_c10d_functional::all_reduce", "_c10d_functional::all_to_all_single",
          "_c10d_functional::all_gather_into_tensor_out")
def functional(c: OpCall) -> OpCost:
    inp = _tensors(c.args[0])
    return OpCost(0, 0, bytes_read=sum(map(nbytes, inp)), bytes_written=sum(map(nbytes, _tensors(c.out))))


register_free("_c10d_functional::wait_tensor")
