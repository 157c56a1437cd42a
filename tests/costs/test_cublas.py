"""cuBLAS's persistent workspace (costs/cublas.py), by torch's rule (aten/src/ATen/cuda/CublasHandlePool.cpp
parseChosenWorkspaceSize), and where memory() and parallel() hold it. Measured on an H100 (torch 2.11,
bench/bench_gpu.py): one 33,554,432-byte block at the first forward GEMM and one at the first backward
GEMM, never freed."""

import torch
from torch import nn

import layerscope as ls
from layerscope.costs.cublas import workspace_bytes


def test_workspace_sizes_by_hand():
    assert workspace_bytes((9, 0), {}) == 32 * 2**20                    # Hopper: :4096:8 = 8 x 4096 KiB
    assert workspace_bytes((10, 0), {}) == workspace_bytes((12, 0), {}) == 32 * 2**20   # Blackwell
    assert workspace_bytes((8, 0), {}) == 4096 * 1024 * 2 + 16 * 1024 * 8 == 8_519_680   # :4096:2:16:8
    # CUBLAS_WORKSPACE_CONFIG: :SIZE:COUNT pairs in KiB, SIZE x COUNT each, summed
    assert workspace_bytes((9, 0), {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}) == 16 * 1024 * 8
    assert workspace_bytes((8, 0), {"CUBLAS_WORKSPACE_CONFIG": ":4096:2:16:8"}) == 8_519_680
    assert workspace_bytes((9, 0), {"CUBLAS_WORKSPACE_CONFIG": "nonsense"}) == 32 * 2**20


def _mlp():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def test_memory_holds_two_workspaces_on_a_cuda_target():
    x = torch.randn(8, 16)
    h100 = ls.memory(_mlp(), x, optimizer="adamw", device="cuda", gpu="H100")
    cpu = ls.memory(_mlp(), x, optimizer="adamw")
    # the forward's thread and the autograd engine's (the backward's): 2 x 32 MiB on sm 9.0, alive
    # from their first GEMM to the end, so in every step's peak; none on the CPU
    assert h100.breakdown["workspace"] == 2 * 32 * 2**20 and cpu.breakdown["workspace"] == 0
    assert all(s.breakdown["workspace"] == 2 * 32 * 2**20 for s in h100.steps)
    a100 = ls.memory(_mlp(), x, optimizer="adamw", device="cuda", gpu="A100")
    assert a100.breakdown["workspace"] == 2 * 8_519_680
    # a no-grad forward has no backward thread: one workspace
    inference = ls.memory(_mlp(), x, training=False, device="cuda", gpu="H100")
    assert inference.breakdown["workspace"] == 32 * 2**20


def test_no_gemm_no_workspace():
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    rep = ls.memory(conv, torch.randn(2, 3, 8, 8), optimizer="sgd", device="cuda", gpu="H100")
    assert rep.breakdown["workspace"] == 0
