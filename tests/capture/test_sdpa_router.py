"""SDPA priced and simulated as the target GPU's kernel (issue 34, item 3; capture/attention.py)."""

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import layerscope
from layerscope.costs.sdpa import RULES
from layerscope.errors import InputError

from ..helpers import assert_unchanged, snapshot

B, H, S, D = 2, 4, 128, 64


class Attn(nn.Module):
    """Only SDPA has MACs: q, k and v are the inputs times a one-element weight (so each needs a
    gradient, and the backward runs every one of the kernel's contractions)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q * self.w, k * self.w, v * self.w)


def inputs(dtype=torch.bfloat16):
    return tuple(torch.randn(B, H, S, D).to(dtype) for _ in range(3))


def attention_macs(rep):
    fwd = sum(op.costs.macs for op in rep.trace.ops if op.phase == "forward")
    bwd = sum(op.costs.macs for op in rep.trace.ops if op.phase == "backward")
    return fwd, bwd


def test_flash_backward_recomputes_math_does_not():
    # Hand derivation, B=2, H=4, S=128, D=Dv=64: scores = 2*4*128*128 = 131,072
    #   forward (any kernel): Q.K^T + P.V = 131,072 * (64 + 64) = 16,777,216 MACs
    #   flash / mem-efficient / cuDNN backward recomputes Q.K^T, then dP, dV, dQ, dK:
    #     131,072 * (3*64 + 2*64) = 41,943,040 MACs (2.5x the forward)
    #   math backward: the four bmm gradients only, 131,072 * 4 * 64 = 33,554,432 MACs (2x)
    m = Attn().to(torch.bfloat16)
    x = inputs()
    before = snapshot(m)
    for kw, kernel in (({"gpu": "A100"}, "flash"), ({"gpu": "H100"}, "cuDNN attention"),
                       ({"gpu": "A100", "attention": "efficient"}, "memory-efficient")):
        rep = layerscope.analyze(m, *x, backward=True, **kw)
        assert attention_macs(rep) == (16_777_216, 41_943_040), kw
        assert any(kernel in n for n in rep.notes), rep.notes
    for kw in ({"device": "meta"}, {"gpu": "V100"}, {"attention": "math"}):
        rep = layerscope.analyze(m, *x, backward=True, **kw)
        assert attention_macs(rep) == (16_777_216, 33_554_432), kw
        assert any("math kernel" in n for n in rep.notes), rep.notes
    assert_unchanged(before, m)


def test_meta_note_without_a_gpu():
    rep = layerscope.analyze(Attn(), *inputs(torch.float32), device="meta")
    assert rep.notes == ("attention: 1 SDPA call priced as the math kernel, which a meta run runs; gpu='H100' "
                         "(--gpu) prices the kernel torch would pick on that GPU (flash, memory-efficient, "
                         "cuDNN), attention= forces one",)
    # a real CPU run prices what CPU ran, with no note
    assert layerscope.analyze(Attn(), *inputs(torch.float32)).notes == ()


def test_bad_requests_are_one_line():
    m = Attn()
    with pytest.raises(InputError, match="flash attention cannot run the SDPA call with float32 q \\[2, 4, 128, "
                                         "64\\], k \\[2, 4, 128, 64\\] on the A100: float32 inputs"):
        layerscope.analyze(m, *inputs(torch.float32), gpu="A100", attention="flash")
    with pytest.raises(InputError, match="this run computes on real tensors"):
        layerscope.analyze(m, *inputs(torch.float32), device="cpu", gpu="H100")
    with pytest.raises(InputError, match="attention must be"):
        layerscope.analyze(m, *inputs(torch.float32), attention="fast")
    with pytest.raises(InputError, match="unknown GPU 'B300'"):
        layerscope.analyze(m, *inputs(torch.float32), gpu="B300")
    with pytest.raises(InputError, match="device='cpu' predicts for the CPU"):
        layerscope.memory(m, *inputs(torch.float32), device="cpu", gpu="H100")


class Block(nn.Module):
    def __init__(self, d=256, h=4):
        super().__init__()
        self.qkv, self.o, self.h = nn.Linear(d, 3 * d), nn.Linear(d, d), h

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.h, d // self.h).permute(2, 0, 3, 1, 4)
        return self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d))


def test_memory_saves_what_the_kernel_saves():
    # bf16, x [4, 512, 256], 4 heads of 64, causal, AdamW, on a CUDA target (512-byte blocks).
    # Saved for backward, hand-derived:
    #   fused kernel (flash on the A100; cuDNN on the H200; mem-efficient forced): q, k and v are views
    #     of the qkv output [4, 512, 768] bf16 = 3,145,728 B; the kernel's output [4, 4, 512, 64] bf16,
    #     laid out [B, S, H, D] so that the out-projection's reshape is a view of it = 1,048,576 B; the
    #     log-sum-exp, 4*4*512 fp32 = 32,768 B; two small RNG-state tensors (philox seed and offset)
    #     of one 512-byte block each = 1,024 B.  Total 4,228,096 B.
    #   math (the V100 has no bf16 fused kernel): q, k, v cast to fp32 and scaled, q' and k' saved by
    #     the first bmm, 2 * 2,097,152 B; the fp32 probabilities [4, 4, 512, 512] = 16,777,216 B,
    #     saved by the second bmm with v in fp32 (2,097,152 B); the output cast back to bf16 is
    #     contiguous [B, H, S, D], so the out-projection saves its reshaped copy, 1,048,576 B.
    #     Total 24,117,248 B.
    m = Block().to(torch.bfloat16)
    x = torch.randn(4, 512, 256).to(torch.bfloat16)
    before = snapshot(m)
    for kw in ({"gpu": "A100"}, {"device": "cuda"}, {"attention": "efficient"}):
        rep = layerscope.memory(m, x, optimizer="adamw", **kw)
        assert rep.totals.saved_activation_bytes == 4_228_096, kw
    rep = layerscope.memory(m, x, optimizer="adamw", gpu="V100")
    assert rep.totals.saved_activation_bytes == 24_117_248
    assert any(n.startswith(f"attention: 1 SDPA call per forward priced as the math kernel, the kernel {RULES} CUDA "
                            "rules pick on the V100 (sm 7.0)") for n in rep.notes), rep.notes
    # the default CUDA target names its GPU
    rep = layerscope.memory(m, x, optimizer="adamw", device="cuda")
    assert any(f"cuDNN attention, the kernel {RULES} CUDA rules pick on the H200 (sm 9.0)" in n
               for n in rep.notes), rep.notes
    assert_unchanged(before, m)


def test_autocast_casts_before_the_choice():
    # fp32 weights under bf16 autocast: CUDA autocast runs SDPA in bf16, so the A100 picks flash
    # (fp32 inputs would have gone to mem-efficient)
    rep = layerscope.memory(Block(), torch.randn(2, 64, 256), optimizer="adamw", gpu="A100",
                            autocast_dtype="bf16")
    assert any("priced as flash attention" in n and "bfloat16 q" in n for n in rep.notes), rep.notes


def test_cli_gpu_and_attention(capsys):
    from layerscope.cli import main
    # --gpu alone sends the summary to meta and prices the A100's kernel (bf16: flash)
    assert main(["summary", "layerscope.examples:tiny_gpt", "--model-dtype", "bf16", "--backward", "--gpu", "A100",
                 "-q"]) == 0
    out = capsys.readouterr().out
    assert f"2 SDPA calls priced as flash attention, the kernel {RULES} CUDA rules pick on the A100 (sm 8.0)" \
        in " ".join(out.split())
    assert main(["memory", "layerscope.examples:tiny_gpt", "--model-dtype", "bf16", "--gpu", "A100,capability=7.0",
                 "-q"]) == 0
    assert "priced as the math kernel" in " ".join(capsys.readouterr().out.split())
    for bad, needle in ((["--gpu", "H100,capability=x"], "capability must be MAJOR.MINOR such as 8.0, got 'x'"),
                        (["--gpu", "B300"], "unknown GPU 'B300'"),
                        (["--gpu", "H100,foo=1"], "unknown figure 'foo'"),
                        (["--attention", "flash"], "flash attention cannot run the SDPA call with float32")):
        assert main(["summary", "layerscope.examples:tiny_gpt", "-q", *bad]) == 1, bad
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and needle in err and "Traceback" not in err, err


class Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = Attn()

    def forward(self, q, k, v):
        from torch.utils.checkpoint import checkpoint
        return checkpoint(self.inner, q, k, v, use_reentrant=False)


def test_checkpointed_blocks_recompute_the_same_kernel():
    # Review finding: the recompute in the backward ran outside the routing and saved other tensors
    # (CheckpointError: "Number of tensors saved during forward: 10 / recomputation: 8").
    # Backward MACs by hand (same shapes as above): the recomputed forward, 16,777,216, plus the fused
    # kernel's backward, 41,943,040: 58,720,256. The note counts the forward's call only.
    m = Checkpointed().to(torch.bfloat16)
    rep = layerscope.analyze(m, *inputs(), backward=True, gpu="A100")
    assert attention_macs(rep) == (16_777_216, 58_720_256)
    assert rep.notes[0].startswith("attention: 1 SDPA call priced as flash attention"), rep.notes
    for kw in ({"gpu": "H100"}, {"device": "cuda"}):
        mem = layerscope.memory(m, *inputs(), optimizer="adamw", **kw)
        assert any(n.startswith("attention: 1 SDPA call per forward priced as cuDNN") for n in mem.notes), mem.notes


def test_switches_and_determinism_are_read():
    from torch.nn.attention import SDPBackend, sdpa_kernel

    class Pinned(Attn):
        def forward(self, q, k, v):
            with sdpa_kernel(SDPBackend.MATH):
                return super().forward(q, k, v)
    rep = layerscope.analyze(Pinned().to(torch.bfloat16), *inputs(), gpu="H100")
    assert "priced as the math kernel" in rep.notes[0] and "turned off" in rep.notes[0], rep.notes
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        rep = layerscope.analyze(Attn().to(torch.bfloat16), *inputs(), gpu="H100")
    finally:
        torch.use_deterministic_algorithms(before)
    # check_cudnn_deterministic: cuDNN is passed over, flash is next on the H100
    assert "priced as flash attention" in rep.notes[0] and "not deterministic" in rep.notes[0], rep.notes


def test_efficient_mask_alignment_is_eight():
    from layerscope.capture.attention import _efficient_mask
    q = torch.empty(2, 4, 1000, 64, device="meta")
    # a contiguous [2, 1, 1000, 1000] mask: strides (1000000, 1000000, 1000, 1) are multiples of 8, so it
    # is only expanded (a view of the same storage), as attention.cpp's preprocess_mask does
    m = torch.empty(2, 1, 1000, 1000, device="meta")
    out = _efficient_mask(m, q, q)
    assert out.shape == (2, 4, 1000, 1000) and out.untyped_storage().nbytes() == m.untyped_storage().nbytes()
    # Sk = 1001: stride 1001 is not, so the last dim is padded to 1008 (a copy) and sliced back
    q2 = torch.empty(2, 4, 1001, 64, device="meta")
    m2 = torch.empty(2, 1, 1001, 1001, device="meta")
    out2 = _efficient_mask(m2, q2, q2)
    assert out2.shape == (2, 4, 1001, 1001) and out2.stride()[-2] == 1008
