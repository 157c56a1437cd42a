"""Scratch CUDA kernels allocate inside themselves (costs/cuda_scratch.py), and a CUDA rank's host tensors,
on a CUDA target: checked by hand; the kernel's source and the H100 measurement are in the module's doc."""

import torch
import torch.nn as nn

import layerscope as ls
from layerscope.costs.cuda_scratch import scratch_bytes


def test_softmax_backward_scratch_sizes():
    g, out = torch.empty(2, 16, 8, 8), torch.empty(2, 16, 8, 8)
    assert scratch_bytes("aten._softmax_backward_data", [g, out]) == 2 * 16 * 8 * 8 * 4 == 8_192
    # half to float: fp32 gradient, fp16 output -> grad * output is fp32
    assert scratch_bytes("aten._softmax_backward_data", [g, out.half()]) == 8_192
    assert scratch_bytes("aten._softmax_backward_data", [g.half(), out.half()]) == 4_096
    assert scratch_bytes("aten._log_softmax_backward_data", [g, out]) is None
    assert scratch_bytes("aten.mm", [g, out]) is None


class _Softmax(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(16, 4096))

    def forward(self, x):
        return torch.softmax(x @ self.w, dim=-1)


def test_softmax_backward_holds_grad_times_output_on_cuda_only():
    # x [1024, 16] @ w [16, 4096] -> softmax y [1024, 4096] fp32 (16,777,216 B), loss y.sum(). The peak is
    # the softmax's backward: w 262,144 + x 65,536 + y 16,777,216 (the output, also saved) + two cuBLAS
    # workspaces of an A100 (2 x 8,519,680, counted from the start) + the loss and its 0-dim gradient
    # (512 each) + the gradient of the softmax's input 16,777,216 + ATen's tmp = grad * output 16,777,216
    m, x = _Softmax(), torch.randn(1024, 16)
    r = ls.memory(m, x, device="cuda", gpu="A100", loss_fn=lambda y: y.sum())
    assert r.peak_step.peak_phase == "backward"
    assert r.peak_bytes == 262_144 + 65_536 + 16_777_216 + 2 * 8_519_680 + 2 * 512 + 2 * 16_777_216 == 67_699_712
    assert r.peak_step.breakdown["temporary"] == 2 * 512 + 2 * 16_777_216
    # the CPU kernel has none: the backward holds y, its input's gradient and then w's gradient
    c = ls.memory(m, x, device="cpu", loss_fn=lambda y: y.sum())
    assert c.peak_step.breakdown["temporary"] < 2 * 16_777_216


def test_adam_steps_are_host_tensors_on_a_cuda_target():
    # torch's Adam keeps each parameter's step as torch.tensor(0.0) on the CPU unless fused or capturable:
    # on a CUDA target the optimizer state is exp_avg and exp_avg_sq alone, 2 x 262,144 B for w
    m, x = _Softmax(), torch.randn(8, 16)
    r = ls.memory(m, x, device="cuda", gpu="A100", optimizer="adam", loss_fn=lambda y: y.sum())
    assert max(s.breakdown["optimizer_state"] for s in r.steps) == 2 * 262_144
    c = ls.memory(m, x, device="cpu", optimizer="adam", loss_fn=lambda y: y.sum())
    assert max(s.breakdown["optimizer_state"] for s in c.steps) == 2 * 262_144 + 4


class _Dropout(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(64, 1024, bias=False)
        self.drop = nn.Dropout(0.1)

    def forward(self, x):
        return self.drop(self.lin(x)).sum(-1)


def test_dropout_keeps_a_bool_mask_on_cuda():
    # CUDA runs dropout as the fused native_dropout, which keeps a bool mask [1024, 1024] (1,048,576 B) for
    # the backward; the CPU's decomposition keeps an fp32 noise tensor (4,194,304 B). The peak is the
    # forward's multiply: w 262,144 + x 262,144 + two A100 cuBLAS workspaces (2 x 8,519,680) + the
    # linear's output and the dropout's (4,194,304 each) + the mask
    m, x = _Dropout().train(), torch.randn(1024, 64)
    r = ls.memory(m, x, device="cuda", gpu="A100")
    assert r.peak_step.breakdown["activation"] == 1_048_576
    assert r.peak_bytes == 2 * 262_144 + 2 * 8_519_680 + 2 * 4_194_304 + 1_048_576 == 27_000_832
    c = ls.memory(m, x, device="cpu")
    assert c.peak_step.breakdown["activation"] == 4_194_304
