"""cuBLAS's persistent workspace on a CUDA device: which ops take it and how many bytes.

PyTorch gives every cuBLAS handle a workspace from the CUDA caching allocator, one per (handle, stream),
at the handle's first GEMM on that stream, and keeps it for the life of the process
(``aten/src/ATen/cuda/CublasHandlePool.cpp``: ``setWorkspaceForHandle`` / ``getCUDABlasLtWorkspace``;
cuBLASLt shares the same workspace unless ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=0``). Handles are per
thread, so a training step holds two: the thread that runs the forward (and the optimizer), and the
autograd engine's device thread that runs the backward. Their size (``parseChosenWorkspaceSize``):
``CUBLAS_WORKSPACE_CONFIG`` (``:SIZE:COUNT`` pairs in KiB, summed as SIZE x COUNT) if set, else 32 MiB
on compute capability 9.x, 10.x and 12.x (Hopper, Blackwell) and 4096 KiB x 2 + 16 KiB x 8 elsewhere.

Checked on an H100 (torch 2.11, bench/bench_gpu.py): each training step's allocator history holds one
33,554,432-byte block taken at the first forward GEMM and one at the first backward GEMM, never freed.
"""

from __future__ import annotations

import os
import re

__all__ = ["GEMM_OPS", "workspace_bytes", "workspace_rule"]

# aten ops that run a cuBLAS / cuBLASLt GEMM or GEMV on CUDA (F.linear and matmul reach these)
GEMM_OPS = frozenset(f"aten.{n}" for n in (
    "mm", "addmm", "_addmm_activation", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "vdot", "_scaled_mm"))

_DEFAULT = 4096 * 1024 * 2 + 16 * 1024 * 8      # :4096:2:16:8
_LARGE = 32 * 2**20                              # :4096:8 on sm 9.x / 10.x / 12.x


def workspace_bytes(capability: tuple[int, int], env: dict | None = None) -> int:
    """Bytes of one cuBLAS workspace on a GPU of this compute capability, as torch sizes it."""
    env = os.environ if env is None else env
    config = env.get("CUBLAS_WORKSPACE_CONFIG")
    default = _LARGE if capability[0] in (9, 10, 12) else _DEFAULT
    if config:
        pairs = re.findall(r":([0-9]+):([0-9]+)", config)
        if pairs:
            return sum(int(size) * 1024 * int(count) for size, count in pairs)
    return default


def workspace_rule(capability: tuple[int, int], env: dict | None = None):
    """``StorageTracker``'s ``workspace`` argument for a CUDA target of this capability: op name ->
    the workspace bytes a GEMM takes (None for every other op)."""
    nbytes = workspace_bytes(capability, env)
    return lambda name: nbytes if name in GEMM_OPS else None
