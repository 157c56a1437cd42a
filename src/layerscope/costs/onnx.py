"""ONNX op types priced by the same shape-level formulas as the aten ops.

Each ONNX op type is registered, in the registry's ONNX namespace (``reg.onnx``), onto the function
of sizes that its aten counterpart uses: Conv and ConvTranspose on ``conv_macs``, Gemm, MatMul and
Einsum on ``contraction``/``matmul_macs``/``einsum_macs``, LSTM/GRU/RNN on ``recurrent_cost``,
Attention on ``attention_cost``, Softmax on ``softmax_flops``, the normalisations on
``normalise_flops``/``rms_norm_flops``, pooling and Resize on ``pool.py``'s, reductions and pointwise
ops on ``elementwise.py``'s, data movement on ``move``. A convention changes in one place.

Op types known to be free (Reshape, Shape, Constant, ...) are registered as ``FREE``; data movement
counts 0 FLOPs with every input read and every output written. An op type with no formula (a custom
domain's, or one not listed here) is uncounted in coverage, never 0; so is a node whose formula
returns None (an einsum with an ellipsis). The built-in formulas count a node only when the shapes
they need are known (the first input and output, and a contraction's operands), else the node is
"unknown shape" in coverage.

Per node (x: the first input, y: the first output; sizes in elements)
  Conv             conv_macs(x, W, y), FLOPs 2*MACs + y with a bias        (as aten convolution)
  ConvTranspose    the same, transposed (each input element scattered)
  Gemm             M*K*N (transA/transB honoured), 2*MACs + M*N with C     (as addmm)
  MatMul, MatMulInteger   numpy matmul semantics, 2*MACs                   (as matmul)
  Einsum           the product of every index's size, 2*MACs
  LSTM, GRU, RNN   T*B*(numel(W) + numel(R)) MACs + the cell arithmetic    (as the fused aten kernels)
  Attention        Q.K^T and P.V, scale + softmax (+ mask) per score       (as SDPA)
  pointwise        1 per element of y; Max/Min/Sum/Mean of n inputs: n - 1 (Mean + 1)
  Softmax, LogSoftmax   5 per element of x
  Layer/Group/InstanceNormalization   4 + 2 + 1 per affine term per element; BatchNormalization:
                   2 + 2 (+ 4 with training_mode); RMSNormalization 3 (+ 1 with a scale)
  MaxPool, AveragePool   window - 1, window per element of y; GlobalAveragePool, ReduceMean: x + y;
                   GlobalMaxPool and the other reductions, ArgMax/ArgMin, CumSum: x;
                   ReduceSumSquare, ReduceL2, ReduceLogSumExp, ReduceLogSum: 2 per element of x
  Resize           per element of y: nearest 0, linear 2**(d+1) - 1 over d resized dims, cubic 31
  TopK             ceil(log2 n) per element of x along the axis
"""

from __future__ import annotations

import functools

from .attention import attention_cost
from .conv import conv_macs
from .elementwise import (map_reduce_flops, mean_flops, pointwise_flops, reduce_flops, softmax_flops, sort_flops,
                          variadic_flops)
from .matmul import contraction, einsum_macs, matmul_macs
from .movement import move
from .norm import normalise_flops, rms_norm_flops
from .pool import avg_pool_flops, interpolation_flops, max_pool_flops
from .registry import NodeCall, OpCost, ShapeUnknown, register_onnx, register_onnx_free
from .rnn import recurrent_cost

__all__ = ["FREE_OPS", "MOVE_OPS", "POINTWISE"]

FREE_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity", "Shape", "Size", "Constant",
            "Dropout", "Optional", "OptionalGetElement", "OptionalHasElement")
MOVE_OPS = ("Transpose", "Concat", "Split", "Slice", "Gather", "GatherElements", "GatherND", "Expand",
            "Tile", "Pad", "Cast", "CastLike", "ConstantOfShape", "Range", "ScatterND", "ScatterElements",
            "Trilu", "DepthToSpace", "SpaceToDepth", "OneHot", "NonZero", "Compress", "ReverseSequence",
            "EyeLike", "SequenceConstruct", "SplitToSequence", "ConcatFromSequence", "SequenceAt",
            "Col2Im", "CenterCropPad", "Unique")
POINTWISE = ("Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Reciprocal", "Neg", "Abs", "Exp", "Log", "Relu",
             "Sigmoid", "Tanh", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh",
             "Acosh", "Atanh", "Floor", "Ceil", "Round", "Sign", "Mod", "Where", "Equal", "Less",
             "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "BitwiseAnd",
             "BitwiseOr", "BitwiseXor", "BitwiseNot", "BitShift", "IsNaN", "IsInf", "Clip", "LeakyRelu",
             "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish", "Softplus", "Softsign", "ThresholdedRelu",
             "PRelu", "Gelu", "Mish", "Shrink")
VARIADIC = ("Max", "Min", "Sum", "Mean")

register_onnx_free(*FREE_OPS)
register_onnx(*MOVE_OPS)(move)


def _onnx(*op_types: str, needs: tuple[int, ...] = (0,), output: bool = True):
    """Register a built-in formula that counts a node only when the shapes of inputs ``needs`` (and of
    the first output, with ``output``) are known, whatever it reads of them."""
    def deco(fn):
        @functools.wraps(fn)
        def formula(node: NodeCall) -> OpCost | None:
            for i in needs:
                node.shape(i)
            if output:
                node.out_shape(0)
            return fn(node)
        register_onnx(*op_types)(formula)
        return formula
    return deco


@_onnx(*POINTWISE)
def pointwise(n: NodeCall) -> OpCost:
    return OpCost(0, pointwise_flops(n.out_numel()))


@_onnx(*VARIADIC)
def variadic(n: NodeCall) -> OpCost:
    return OpCost(0, variadic_flops(len(n.inputs), n.out_numel(), mean=n.op_type == "Mean"))


@_onnx("Conv", "ConvTranspose", needs=(0, 1))
def conv(n: NodeCall) -> OpCost:
    y = n.out_numel()
    macs = conv_macs(n.numel(0), n.shape(1), y, transposed=n.op_type == "ConvTranspose")
    return contraction(macs, y if n.has(2) else 0)


@_onnx("Gemm", needs=(0, 1))
def gemm(n: NodeCall) -> OpCost:
    a, b = n.shape(0), n.shape(1)
    m, k = (a[1], a[0]) if n.attr("transA") else (a[0], a[1])
    cols = b[0] if n.attr("transB") else b[1]
    return contraction(m * k * cols, m * cols if n.has(2) else 0)


@_onnx("MatMul", "MatMulInteger", needs=(0, 1))
def matmul(n: NodeCall) -> OpCost:
    return contraction(matmul_macs(n.shape(0), n.shape(1)))


@_onnx("Einsum")
def einsum(n: NodeCall) -> OpCost | None:
    if any(s is None for s in n.inputs):
        return None
    macs = einsum_macs(n.attr("equation", ""), [n.shape(i) for i in range(len(n.inputs))])
    return None if macs is None else contraction(macs)


@_onnx("LSTM", "GRU", "RNN", needs=(0, 1, 2), output=False)
def recurrent(n: NodeCall) -> OpCost:
    # X [T, B, I] (layout 1: [B, T, I]), W [dirs, gates*H, I], R [dirs, gates*H, H]
    x, w, r = n.shape(0), n.shape(1), n.shape(2)
    return recurrent_cost(x[0] * x[1], n.numel(1) + n.numel(2), w[0] * r[2], n.op_type)


@_onnx("Attention", needs=(0, 1, 2), output=False)
def attention(n: NodeCall) -> OpCost:
    q, k, v = n.shape(0), n.shape(1), n.shape(2)
    if len(q) == 3:                                   # [B, S, H*D]: heads from the attributes
        hq, hkv = n.attr("q_num_heads"), n.attr("kv_num_heads")
        if not hq or not hkv:
            raise ShapeUnknown("3-D Attention inputs without q_num_heads/kv_num_heads: head dims unknown")
        heads, sq, d = q[0] * hq, q[1], q[2] // hq
        sk, dv = k[1], v[2] // hkv
    else:                                             # [B, H, S, D]
        heads, sq, d = 1, q[-2], q[-1]
        for s in q[:-2]:
            heads *= s
        sk, dv = k[-2], v[-1]
    return attention_cost(heads * sq * sk, d, dv, bias=n.has(3))


@_onnx("Softmax", "LogSoftmax")
def softmax(n: NodeCall) -> OpCost:
    return OpCost(0, softmax_flops(n.numel(0)))


@_onnx("LayerNormalization", "GroupNormalization", "InstanceNormalization")
def normalisation(n: NodeCall) -> OpCost:
    return OpCost(0, normalise_flops(n.numel(0), stats=True, weight=n.has(1), bias=n.has(2)))


@_onnx("BatchNormalization")
def batch_norm(n: NodeCall) -> OpCost:
    # scale and B are required inputs; in inference mode the stored statistics are used
    return OpCost(0, normalise_flops(n.numel(0), stats=bool(n.attr("training_mode")), weight=True, bias=True))


@_onnx("RMSNormalization", "SimplifiedLayerNormalization")
def rms_norm(n: NodeCall) -> OpCost:
    return OpCost(0, rms_norm_flops(n.numel(0), weight=n.has(1)))


@_onnx("MaxPool")
def max_pool(n: NodeCall) -> OpCost:
    return OpCost(0, max_pool_flops(n.out_numel(), n.attrs["kernel_shape"]))


@_onnx("AveragePool")
def avg_pool(n: NodeCall) -> OpCost:
    return OpCost(0, avg_pool_flops(n.out_numel(), n.attrs["kernel_shape"]))


@_onnx("GlobalAveragePool", "ReduceMean")
def mean(n: NodeCall) -> OpCost:
    return OpCost(0, mean_flops(n.numel(0), n.out_numel()))


@_onnx("GlobalMaxPool", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ArgMax", "ArgMin", "ReduceL1",
       "CumSum")
def reduce(n: NodeCall) -> OpCost:
    return OpCost(0, reduce_flops(n.numel(0)))


# ReduceLogSumExp is ONNX's log(sum(exp(x))) without the max subtraction of aten logsumexp's stable
# kernel (4 per element): exp and add, 2 per element, like a norm's square and add.
@_onnx("ReduceSumSquare", "ReduceL2", "ReduceLogSumExp", "ReduceLogSum")
def map_reduce(n: NodeCall) -> OpCost:
    return OpCost(0, map_reduce_flops(n.numel(0)))


@_onnx("Resize")
def resize(n: NodeCall) -> OpCost:
    x, y = n.shape(0), n.out_shape(0)
    resized = sum(1 for a, b in zip(x, y) if a != b) if len(x) == len(y) else 0
    return OpCost(0, interpolation_flops(n.attr("mode", "nearest"), resized) * n.out_numel())


@_onnx("TopK")
def topk(n: NodeCall) -> OpCost:
    x = n.shape(0)
    return OpCost(0, sort_flops(n.numel(0), x[n.attr("axis", -1)]))
