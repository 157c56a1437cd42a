"""Scratch a CUDA kernel takes from the caching allocator inside itself (no tensor of it is ever seen by a
dispatch mode), on a CUDA target: op name -> the bytes, from the op's input tensors.

* ``aten._softmax_backward_data``: ATen's ``softmax_backward_cuda_out``
  (aten/src/ATen/native/cuda/SoftMax.cu) computes ``Tensor tmp = grad * output`` and runs the kernel on it:
  a tensor of the gradient's shape in the promoted dtype of the two, alive while the op runs, beside its
  output. The CPU kernel has none. Seen on an H100 (torch 2.11, the allocator's history with C++ frames):
  a 67,108,864-byte block allocated by ``at::_ops::mul_Tensor`` under ``structured_softmax_backward_cuda_out``
  for each [1, 16, 1024, 1024] fp32 softmax of the math attention kernel, freed before the op returns;
  without it a Llama pipeline stage's peak read 2.7% under ``torch.cuda.max_memory_allocated``.
  (``_log_softmax_backward_data`` runs on its inputs directly: none.)
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch

__all__ = ["SCRATCH", "scratch_bytes"]


def _softmax_backward(ins: Sequence[torch.Tensor]) -> int:
    grad, output = ins[0], ins[1]
    dtype = torch.promote_types(grad.dtype, output.dtype)
    return grad.numel() * dtype.itemsize


SCRATCH: dict[str, Callable[[Sequence[torch.Tensor]], int]] = {
    "aten._softmax_backward_data": _softmax_backward,
}


def scratch_bytes(name: str, ins: Sequence[torch.Tensor]) -> int | None:
    """Bytes of scratch op ``name`` allocates inside itself on CUDA for these input tensors (None: none)."""
    rule = SCRATCH.get(name)
    if rule is None or len(ins) < 2:
        return None
    return rule(ins)
