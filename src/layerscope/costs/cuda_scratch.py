"""Where a CUDA kernel holds other bytes than the simulation's CPU kernels show, on a CUDA target
(``CudaKernels``, one per run: the storage tracker asks it at every op).

* Scratch a kernel allocates and frees inside itself (no tensor of it is ever seen by a dispatch mode):
  ``aten._softmax_backward_data``: ATen's ``softmax_backward_cuda_out`` (aten/src/ATen/native/cuda/SoftMax.cu)
  computes ``Tensor tmp = grad * output`` and runs the kernel on it: a tensor of the gradient's shape in
  the promoted dtype of the two, alive while the op runs, beside its output. The CPU kernel has none.
  Seen on an H100 (torch 2.11, the allocator's history with C++ frames): a 67,108,864-byte block
  allocated by ``at::_ops::mul_Tensor`` under ``structured_softmax_backward_cuda_out`` for each
  [1, 16, 1024, 1024] fp32 softmax of the math attention kernel, freed before the op returns; without
  it a Llama pipeline stage's peak read 2.7% under ``torch.cuda.max_memory_allocated``.
  (``_log_softmax_backward_data`` runs on its inputs directly: none.)
* Dropout's mask: ``at::dropout`` runs the fused ``native_dropout`` on CUDA, which keeps a bool mask (one
  byte an element) for the backward; on the CPU it is ``_dropout_impl``, ``empty_like(input)``,
  ``bernoulli_``, ``div_`` and a multiply, which keeps a noise tensor in the input's dtype (two bytes an
  element in bf16, four in fp32). The three ops in that order on one tensor are that decomposition: the
  noise's block is given the mask's bytes. Seen on the same H100 (GPT-2, bf16, FSDP): the 17 dropouts of
  a step hold 4,194,304-byte masks where the simulation held 8,388,608-byte noise, 71 MB at the peak (its
  prediction read +1.38% over the allocator's peak).
"""

from __future__ import annotations

from typing import Sequence

import torch

__all__ = ["CudaKernels", "scratch_bytes"]


def _softmax_backward(ins: Sequence[torch.Tensor]) -> int:
    grad, output = ins[0], ins[1]
    dtype = torch.promote_types(grad.dtype, output.dtype)
    return grad.numel() * dtype.itemsize


_SCRATCH = {"aten._softmax_backward_data": _softmax_backward}


def scratch_bytes(name: str, ins: Sequence[torch.Tensor]) -> int | None:
    """Bytes of scratch op ``name`` allocates inside itself on CUDA for these input tensors (None: none)."""
    rule = _SCRATCH.get(name)
    if rule is None or len(ins) < 2:
        return None
    return rule(ins)


class CudaKernels:
    """One run's view of a CUDA target's kernels: ``scratch`` (bytes an op allocates inside itself) and
    ``resized`` (a tensor the CUDA kernel keeps at another size than the CPU decomposition made it)."""

    __slots__ = ("_noise", "_seen")

    def __init__(self) -> None:
        self._noise: torch.Tensor | None = None   # empty_like's output, then bernoulli_'s target
        self._seen = 0                            # 1: empty_like, 2: then bernoulli_ on it

    @staticmethod
    def scratch(name: str, ins: Sequence[torch.Tensor]) -> int | None:
        return scratch_bytes(name, ins)

    def resized(self, name: str, ins: Sequence[torch.Tensor], outs: Sequence[torch.Tensor]):
        """(tensor, bytes) when this op completes dropout's CPU decomposition on the CUDA target: the
        noise is the fused kernel's bool mask; None otherwise."""
        seen, noise = self._seen, self._noise
        self._seen, self._noise = 0, None
        if name == "aten.empty_like" and outs and outs[0].is_floating_point():
            self._seen, self._noise = 1, outs[0]
        elif noise is not None and ins and ins[0] is noise:
            if name == "aten.bernoulli_" and seen == 1:
                self._seen, self._noise = 2, noise
            elif name == "aten.div_" and seen == 2:
                return noise, noise.numel()
        return None
