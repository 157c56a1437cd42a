"""ONNX op types in the cost registry (issue 20, item 2): priced by the same shape-level formulas as
the aten ops, overridable per analysis with ``analyze_onnx(path, costs=reg)``. Every expected number
is derived by hand in the comment beside it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.costs import FREE, NodeCall, OpCost, ShapeUnknown, default_registry
from layerscope.errors import InputError, RegistryError

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(nodes, inputs, outputs, inits=(), opset=20, domains=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    ops = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    return helper.make_model(g, opset_imports=ops, ir_version=10)


def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _w(name, shape):
    return numpy_helper.from_array(torch.randn(shape).numpy(), name)


def _attention():
    # B=1, H=12, S=64, D=64: Q.K^T and P.V 12*64*64*64 = 3,145,728 MACs each; 12*64*64 = 49,152 scores
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"])]
    shape = [1, 12, 64, 64]
    return _model(nodes, [_f("q", shape), _f("k", shape), _f("v", shape)], [_f("o", None)])


def _frobnicate():
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    return _model([node], [_f("x", [2, 2])], [_f("y", [2, 2])], domains=["com.example"])


def test_softmax_counted_as_zero_flops_in_one_analysis(tmp_path):
    path = tmp_path / "att.onnx"
    path.write_bytes(_attention().SerializeToString())
    reg = default_registry().copy()
    reg.onnx.override("Softmax", lambda n: OpCost(0, 0))
    rep = ls.analyze_onnx(str(path), costs=reg)
    # 2 * 6,291,456 MACs; the softmax's 5 * 49,152 = 245,760 FLOPs are gone
    assert rep.totals.macs == 6_291_456 and rep.totals.flops == 2 * 6_291_456
    assert rep.totals.complete and rep.trace.options["costs"] == "custom"
    # bytes keep the default rule: s read and p written, 49,152 floats each = 196,608 B
    soft = rep.graph.nodes[2]
    assert soft.status == "counted" and (soft.bytes_read, soft.bytes_written) == (196_608, 196_608)
    # the default registry is untouched: softmax 5 per score
    default = ls.analyze_onnx(str(path))
    assert default.totals.flops == 2 * 6_291_456 + 5 * 49_152 and "costs" not in default.trace.options


def test_custom_domain_op_uncounted_by_default_counted_when_registered():
    rep = ls.analyze_onnx(_frobnicate())
    assert [(u.op, u.count) for u in rep.coverage.uncounted] == [("onnx.com.example.Frobnicate", 1)]
    assert not rep.totals.complete
    reg = default_registry().copy()

    @reg.onnx.register("com.example.Frobnicate")
    def frobnicate(n: NodeCall) -> OpCost:
        # 3 FLOPs per output element, and it reads its input twice
        return OpCost(0, 3 * n.out_numel(), bytes_read=2 * 4 * n.numel(0))

    rep = ls.analyze_onnx(_frobnicate(), costs=reg)
    # [2, 2] output: 4 elements x 3 = 12 FLOPs; read 2 x 16 B = 32 (the formula's), written 16 B (default)
    node = rep.graph.nodes[0]
    assert rep.totals.flops == 12 and rep.totals.macs == 0 and rep.totals.complete
    assert node.status == "counted" and (node.bytes_read, node.bytes_written) == (32, 16)
    # a default-domain op type of the same name is another key
    assert "com.example.Frobnicate" in reg.onnx and "Frobnicate" not in reg.onnx


def test_removed_op_type_is_uncounted_never_zero():
    node = helper.make_node("Relu", ["x"], ["y"])
    m = _model([node], [_f("x", [4, 4])], [_f("y", None)])
    assert ls.analyze_onnx(m).totals.flops == 16           # 1 per element of [4, 4]
    reg = default_registry().copy()
    reg.onnx.remove("Relu")
    rep = ls.analyze_onnx(m, costs=reg)
    assert not rep.totals.complete and [u.op for u in rep.coverage.uncounted] == ["onnx.Relu"]
    assert rep.graph.nodes[0].status == "uncounted"


def test_formula_that_cannot_count_a_node():
    reg = default_registry().copy()
    reg.onnx.override("Relu", lambda n: None)                       # not this node: uncounted

    def needs_second_input(n):
        return OpCost(0, n.numel(1))                                 # Relu has no input 1: ShapeUnknown
    m = _model([helper.make_node("Relu", ["x"], ["y"])], [_f("x", [4, 4])], [_f("y", None)])
    assert ls.analyze_onnx(m, costs=reg).graph.nodes[0].status == "uncounted"
    reg.onnx.override("Relu", needs_second_input)
    rep = ls.analyze_onnx(m, costs=reg)
    assert rep.graph.nodes[0].status == "unknown shape" and not rep.totals.complete
    reg.onnx.override("Relu", FREE)
    rep = ls.analyze_onnx(m, costs=reg)
    assert rep.graph.nodes[0].status == "free" and rep.totals.complete and rep.graph.nodes[0].bytes_read == 0
    reg.onnx.override("Relu", lambda n: (0, 16))
    with pytest.raises(RegistryError, match="Relu returned tuple"):
        ls.analyze_onnx(m, costs=reg)


def test_wrapping_the_default_formula():
    # FMA as 1 FLOP on Gemm: x [2, 8] W^T [8, 4] + b: 64 MACs; default 2*64 + 8 bias adds = 136; wrapped 72
    node = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)
    m = _model([node], [_f("x", [2, 8])], [_f("y", None)], [_w("w", (4, 8)), _w("b", (4,))])
    reg = default_registry().copy()
    gemm = reg.onnx.get("Gemm")
    reg.onnx.override("Gemm", lambda n: (k := gemm(n))._replace(flops=k.flops - k.macs))
    assert ls.analyze_onnx(m).totals.flops == 136
    assert ls.analyze_onnx(m, costs=reg).totals.flops == 72


def test_registry_misuse_is_refused():
    with pytest.raises(RegistryError, match="read-only"):
        default_registry().onnx.override("Softmax", lambda n: OpCost(0, 0))
    with pytest.raises(RegistryError, match="read-only"):
        default_registry().onnx.remove("Softmax")
    reg = default_registry().copy()
    with pytest.raises(RegistryError, match="already has a cost formula"):
        reg.onnx.register("Softmax", lambda n: OpCost(0, 0))
    with pytest.raises(RegistryError, match="not an ONNX op type"):
        reg.onnx.register("com.example.", lambda n: OpCost(0, 0))
    with pytest.raises(RegistryError, match="function of a NodeCall"):
        reg.onnx.register("MyOp", 3)
    with pytest.raises(InputError, match="CostRegistry"):
        ls.analyze_onnx(_frobnicate(), costs={"Softmax": None})
    # "ai.onnx.X" and "X" name the same default-domain op type
    assert reg.onnx.get("ai.onnx.Softmax") is reg.onnx.get("Softmax") is not None


def test_onnx_namespace_is_apart_from_torch_ops_named_onnx():
    # torch.onnx.ops registers torch.ops.onnx.Attention (schema "onnx::Attention"): the aten table
    # must not hand that op the ONNX node formula, nor the other way round
    import torch.onnx.ops  # noqa: F401
    reg = default_registry()
    assert reg.get(torch.ops.onnx.Attention) is None
    assert reg.onnx.get("Attention") is not None
    assert reg.onnx.lookup("Attention", "") is reg.onnx.get("Attention")
    # a copy carries both tables; changing it leaves the default as it was
    mine = reg.copy()
    mine.onnx.remove("Attention")
    assert "Attention" not in mine.onnx and "Attention" in reg.onnx and len(mine) == len(reg)


def test_node_call_shapes():
    n = NodeCall("Add", [(2, 3), ("N", 3), None], [(2, 3)], {"alpha": 1})
    assert n.numel(0) == 6 and n.out_shape() == (2, 3) and n.attr("alpha") == 1 and n.attr("beta", 0) == 0
    assert n.has(1) and not n.has(2) and not n.has(5)
    for i in (1, 2, 5):
        with pytest.raises(ShapeUnknown):
            n.shape(i)


# One convention, one place: an ONNX node and the PyTorch module it exports from count the same FLOPs.
class _Same(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _gelu(x):
    return nn.functional.gelu(x)


@pytest.mark.parametrize("case", ["softmax", "layer_norm", "linear", "conv", "max_pool", "avg_pool", "gelu",
                                  "reduce_mean", "lstm"])
def test_onnx_and_aten_formulas_agree(case):
    torch.manual_seed(0)
    x4 = [2, 3, 8, 8]
    if case == "softmax":
        # 5 per element of [2, 3, 8, 8] = 384 elements: 1,920
        module, x = nn.Softmax(-1), torch.randn(x4)
        node, inits = helper.make_node("Softmax", ["x"], ["y"], axis=-1), []
    elif case == "layer_norm":
        # (4 + 2 + 1 + 1) per element of [2, 5, 16] = 160 elements: 1,280
        module, x = nn.LayerNorm(16), torch.randn(2, 5, 16)
        node = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1)
        inits = [_w("s", (16,)), _w("b", (16,))]
    elif case == "linear":
        # [4, 8] x [8, 3]: 96 MACs, 2*96 + 12 bias adds = 204
        module, x = nn.Linear(8, 3), torch.randn(4, 8)
        node, inits = helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1), [_w("w", (3, 8)), _w("b", (3,))]
    elif case == "conv":
        # 4 output channels of 6x6 from 3x3x3 windows: 2*4*36*27 = 7,776 MACs; + 288 bias adds
        module, x = nn.Conv2d(3, 4, 3), torch.randn(x4)
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"])
        inits = [_w("w", (4, 3, 3, 3)), _w("b", (4,))]
    elif case == "max_pool":
        # [2, 3, 4, 4] outputs x (4 - 1) comparisons = 288
        module, x = nn.MaxPool2d(2), torch.randn(x4)
        node, inits = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2]), []
    elif case == "avg_pool":
        # [2, 3, 4, 4] outputs x 4 = 384
        module, x = nn.AvgPool2d(2), torch.randn(x4)
        node, inits = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2]), []
    elif case == "gelu":
        # 1 per element: 384
        module, x = _Same(_gelu), torch.randn(x4)
        node, inits = helper.make_node("Gelu", ["x"], ["y"]), []
    elif case == "reduce_mean":
        # global average pool of [2, 3, 8, 8]: 384 adds + 6 divides = 390
        module, x = nn.AdaptiveAvgPool2d(1), torch.randn(x4)
        node, inits = helper.make_node("GlobalAveragePool", ["x"], ["y"]), []
    else:
        # LSTM 8 -> 16 over T=5, B=2 (batch first in torch, [T, B, I] in ONNX): 10 rows x (64*8 + 64*16)
        # = 15,360 MACs; FLOPs 2*MACs + 10 rows x 16 units x 21 = 34,080 (bias adds inside the 21)
        module, x = nn.LSTM(8, 16, bias=False), torch.randn(5, 2, 8)
        node = helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=16)
        inits = [_w("w", (1, 64, 8)), _w("r", (1, 64, 16))]
    m = _model([node], [_f("x", list(x.shape))], [_f("y", None)], inits, opset=22)
    got, ref = ls.analyze_onnx(m).totals, ls.analyze(module, x).totals
    assert got.complete and ref.complete
    assert (got.macs, got.flops) == (ref.macs, ref.flops)
    expected = {"softmax": (0, 1_920), "layer_norm": (0, 1_280), "linear": (96, 204), "conv": (7_776, 15_840),
                "max_pool": (0, 288), "avg_pool": (0, 384), "gelu": (0, 384), "reduce_mean": (0, 390),
                "lstm": (15_360, 34_080)}[case]
    assert (got.macs, got.flops) == expected
