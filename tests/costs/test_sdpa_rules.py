"""Which SDPA kernel torch's CUDA rules pick (costs/sdpa.py), case by case.

Each expected kernel is read off torch's own rules in aten/src/ATen/native/transformers/cuda/sdp_utils.cpp
(select_sdp_backend, priority_order, can_use_{cudnn,flash,mem_efficient}_attention, and the shared checks
in sdp_utils_cpp.h), as torch 2.14.1's CUDA 13.0 wheel with cuDNN 9.24 runs them; the function whose
check decides each case is named beside it.
"""

import pytest
import torch

from layerscope.costs.gpus import gpu
from layerscope.costs.sdpa import choose, order, unusable

B, H, S, D = 2, 8, 128, 64


def qkv(dtype=torch.bfloat16, d=D, dv=None, sq=S, sk=S, hk=H, grad=False):
    q = torch.empty(B, H, sq, d, dtype=dtype, device="meta", requires_grad=grad)
    k = torch.empty(B, hk, sk, d, dtype=dtype, device="meta", requires_grad=grad)
    v = torch.empty(B, hk, sk, dv or d, dtype=dtype, device="meta", requires_grad=grad)
    return q, k, v


def pick(name, q, k, v, mask=None, dropout=0.0, causal=False, gqa=False, grad=False):
    return choose(gpu(name), q, k, v, mask, dropout, causal, gqa, grad)[0]


def test_priority_order():
    # priority_order: check_prefer_cudnn_attention is true on sm 9.x/10.x with cuDNN > 9.15 on CUDA 13
    assert order(gpu("H100")) == order(gpu("H200")) == ("cudnn", "flash", "efficient", "math")
    # elsewhere the default order: flash, efficient, math, cudnn (cuDNN last, after the math fallback)
    assert order(gpu("A100")) == order(gpu("L4")) == order(gpu("V100")) == ("flash", "efficient", "math", "cudnn")


@pytest.mark.parametrize("name, dtype, kernel", [
    ("H100", torch.bfloat16, "cudnn"),      # can_use_cudnn_attention: every check passes, first in order
    ("H200", torch.float16, "cudnn"),
    ("A100", torch.bfloat16, "flash"),      # can_use_flash_attention: first in the default order
    ("L4", torch.float16, "flash"),
    ("A100", torch.float32, "efficient"),   # check_dtypes_flash_attention: fp16/bf16 only; mem-efficient
                                            # takes fp32 (greater_than_or_equal_sm80 dtypes)
    ("H100", torch.float32, "efficient"),   # cuDNN: check_dtypes_low_precision refuses fp32 too
    ("V100", torch.float16, "efficient"),   # check_flash_attention_hardware_support: sm 8.0-12.1 only
    ("V100", torch.bfloat16, "math"),       # mem-efficient below sm 8.0: fp16/fp32 only
])
def test_dtype_and_architecture(name, dtype, kernel):
    assert pick(name, *qkv(dtype)) == kernel


def test_masks():
    q, k, v = qkv()
    bias = torch.empty(B, 1, S, S, dtype=torch.bfloat16, device="meta")
    # check_for_attn_mask: flash takes no mask, so A100 falls to mem-efficient
    assert pick("A100", q, k, v, bias) == "efficient"
    # check_attn_mask_shape: a 4-D [B, 1, Sq, Sk] mask suits cuDNN
    assert pick("H100", q, k, v, bias) == "cudnn"
    # a 3-D mask does not (only 2-D or 4-D), and flash takes none: mem-efficient
    assert pick("H100", q, k, v, torch.empty(B, S, S, dtype=torch.bfloat16, device="meta")) == "efficient"
    # check_last_dim_stride_equals_1_dense: a mask whose last dim has stride != 1 rules out mem-efficient
    strided = torch.empty(B, 1, S, S, dtype=torch.bfloat16, device="meta").transpose(-1, -2)
    assert pick("A100", q, k, v, strided) == "math"


def test_causal_and_sequence_lengths():
    q, k, v = qkv(sq=64, sk=128)
    # check_flash_causal_non_square_seqlens: is_causal needs Sq == Sk
    assert pick("A100", q, k, v, causal=True) == "efficient"
    assert pick("A100", q, k, v, causal=False) == "flash"
    # check_cudnn_tensor_shapes: key length 1 refused by cuDNN (flash is next)
    assert pick("H100", *qkv(sk=1)) == "flash"


def test_head_dims():
    # cuDNN on sm 9.0 with cuDNN > 9.22: head dims up to 256; for training only <=128, 192/128, 256/256
    # (check_cudnn_d256_bprop_head_dim)
    assert pick("H100", *qkv(d=256, grad=True), grad=True) == "cudnn"
    assert pick("H100", *qkv(d=160, grad=True), grad=True) == "flash"
    assert pick("H100", *qkv(d=160)) == "cudnn"                     # inference: up to 256
    # check_head_dim_size_flash: one head dim, at most 256; over it mem-efficient (any multiple of 8)
    assert pick("A100", *qkv(d=320)) == "efficient"
    assert pick("A100", *qkv(d=64, dv=128)) == "efficient"
    # check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120: training with head dim in
    # (192, 224] is refused on sm 8.9 (L4), head dim > 224 without dropout is allowed
    assert pick("L4", *qkv(d=200, grad=True), grad=True) == "efficient"
    assert pick("L4", *qkv(d=256, grad=True), grad=True) == "flash"
    assert pick("L4", *qkv(d=256, grad=True), dropout=0.25, grad=True) == "efficient"
    assert pick("A100", *qkv(d=200, grad=True), grad=True) == "flash"   # sm 8.0 is not in that range
    # check_head_dim_size_mem_efficient: fp16 head dims must be multiples of 8 (alignment 128/16)
    assert pick("V100", *qkv(torch.float16, d=36)) == "math"


def test_dropout_and_heads():
    # check_cudnn_dropout: a multiple of 1/16 only (0.1 is not: flash next); 0.125 is
    assert pick("H100", *qkv(), dropout=0.1) == "flash"
    assert pick("H100", *qkv(), dropout=0.125) == "cudnn"
    # grouped-query heads: only with enable_gqa (check_batch_size_and_num_heads_dense)
    q, k, v = qkv(hk=2)
    assert pick("A100", q, k, v, gqa=True) == "flash"
    assert pick("A100", q, k, v, gqa=False) == "math"
    assert pick("A100", *qkv(hk=3), gqa=True) == "math"       # 8 query heads are no multiple of 3


def test_forced_kernel_reasons():
    q, k, v = qkv(torch.float32)
    assert unusable("flash", gpu("A100"), q, k, v, None, 0.0, False, False, False) == \
        "float32 inputs (it takes float16/bfloat16)"
    assert unusable("math", gpu("V100"), q, k, v, None, 0.0, False, False, False) is None
    assert "sm 8.0-12.1" in unusable("cudnn", gpu("V100"), *qkv(torch.float16), None, 0.0, False, False, False)
    # a GPU row with its capability overridden follows it
    assert pick(gpu("H100", capability=(8, 0)).name, *qkv()) == "cudnn"   # the name alone is still the H100
    assert choose(gpu("H100", capability=(8, 0)), *qkv(), None, 0.0, False, False, False)[0] == "flash"


def test_multi_query_without_enable_gqa_follows_the_running_torch():
    # pytorch#191085 (torch 2.14): a single key/value head broadcasts to every fused kernel without
    # enable_gqa; torch 2.13 takes the math kernel (measured on the two CPU builds here: the CPU rules
    # pick a fused kernel for q [1, 8, 16, 64], k = v [1, 1, 16, 64] on 2.14.1, math on 2.13.0)
    from layerscope.costs.sdpa import TORCH
    q, k, v = qkv(hk=1)
    assert pick("A100", q, k, v, gqa=False) == ("flash" if TORCH >= (2, 14) else "math")


def test_cudnn_decode_rule_on_sm10():
    # check_cudnn_tensor_shapes (2.14.1: "cuDNN SDPA decode is disabled on SM 10.x and 11.x for cuDNN
    # versions 9.19-9.25.0 (except 9.24.1)"): a one-token query goes to flash on an sm 10.0 row
    from layerscope.costs.sdpa import choose
    g = gpu("H100", capability=(10, 0))
    assert choose(g, *qkv(sq=1, sk=128), None, 0.0, False, False, False)[0] == "flash"
    assert choose(g, *qkv(sq=2, sk=128), None, 0.0, False, False, False)[0] == "cudnn"
    assert choose(gpu("H100"), *qkv(sq=1, sk=128), None, 0.0, False, False, False)[0] == "cudnn"
