"""ONNX analysis: hand-derived costs of single nodes, shapes and attributes, parameters, liveness,
coverage of unknown shapes, external-data safety, and agreement with the PyTorch analysis of the
same model exported with torch.onnx (dynamo)."""

from __future__ import annotations

import pytest
import torch

import layerscope as ls

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _model(nodes, inputs, outputs, inits=(), opset=20, value_info=()):
    g = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits), value_info=list(value_info))
    # IR version 10: what onnxruntime 1.2x runs (onnx's newest is ahead of it)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _f(name, shape):
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def _w(name, shape, dtype=torch.float32):
    return numpy_helper.from_array(torch.zeros(shape, dtype=dtype).numpy(), name)


def test_conv_transpose_hand_count():
    # ConvTranspose2d 64 -> 32, kernel 4, stride 2, padding 1: 16x16 -> 32x32. Each of the
    # 64*16*16 = 16,384 input elements is scattered through 32 output channels x 4*4 taps:
    # 16,384 * 32 * 16 = 8,388,608 MACs; FLOPs 2 * MACs + bias adds 32*32*32 = 32,768
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2], pads=[1, 1, 1, 1])
    m = _model([node], [_f("x", [1, 64, 16, 16])], [_f("y", None)], [_w("w", (64, 32, 4, 4)), _w("b", (32,))])
    rep = ls.analyze_onnx(m)
    n = rep.graph.nodes[0]
    assert n.outputs[0][1] == (1, 32, 32, 32)
    assert rep.totals.macs == 8_388_608 and rep.totals.flops == 2 * 8_388_608 + 32_768
    assert n.attributes["kernel_shape"] == [4, 4] and n.attributes["dilations"] == [1, 1]
    # params: 64*32*4*4 = 32,768 weights + 32 biases
    assert rep.totals.params == 32_800 and n.params == 32_800
    # bytes: read x 64*16*16*4 = 65,536 + w 131,072 + b 128; write 32*32*32*4 = 131,072
    assert (n.bytes_read, n.bytes_written) == (196_736, 131_072)


def test_matmul_vector_and_decomposed_attention():
    # [4, 8] x [8]: the vector is promoted to [8, 1]: 4 * 8 * 1 = 32 MACs
    mv = _model([helper.make_node("MatMul", ["a", "v"], ["y"])], [_f("a", [4, 8]), _f("v", [8])], [_f("y", None)])
    assert ls.analyze_onnx(mv).totals.macs == 32
    # attention B=1, H=12, S=64, D=64: Q.K^T = 12*64*64*64 = 3,145,728 MACs, P.V the same: 6,291,456
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]),
             helper.make_node("Softmax", ["s"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["o"])]
    shape = [1, 12, 64, 64]
    att = _model(nodes, [_f("q", shape), _f("k", shape), _f("v", shape)], [_f("o", None)])
    rep = ls.analyze_onnx(att)
    assert rep.totals.macs == 6_291_456
    # FLOPs: 2 * MACs + softmax 5 per score (12*64*64 = 49,152 scores); the transpose moves data only
    assert rep.totals.flops == 2 * 6_291_456 + 5 * 49_152
    assert rep.graph.histogram == {"MatMul": 2, "Transpose": 1, "Softmax": 1}
    # the opset-23 Attention op counts the same MACs
    fused = helper.make_model(helper.make_graph(
        [helper.make_node("Attention", ["q", "k", "v"], ["o"])], "g",
        [_f("q", shape), _f("k", shape), _f("v", shape)], [_f("o", None)]),
        opset_imports=[helper.make_opsetid("", 23)])
    assert ls.analyze_onnx(fused).totals.macs == 6_291_456


def test_lstm_scales_with_sequence_length():
    # LSTM hidden 16, input 8, one direction: W [1, 64, 8], R [1, 64, 16]; per step and batch row
    # 64*8 + 64*16 = 1,536 MACs -> T=10, B=2: 30,720; T=20: 61,440
    def lstm(t):
        node = helper.make_node("LSTM", ["x", "w", "r"], ["y", "h", "c"], hidden_size=16)
        return _model([node], [_f("x", [t, 2, 8])], [_f("y", None)], [_w("w", (1, 64, 8)), _w("r", (1, 64, 16))])
    a, b = ls.analyze_onnx(lstm(10)).totals.macs, ls.analyze_onnx(lstm(20)).totals.macs
    assert (a, b) == (30_720, 61_440)


def test_symbolic_dims_params_and_liveness():
    # Gemm on a symbolic batch N: unknown until N is given; the weight is shared by two Gemms
    # (counted once) and an int64 shape constant is not a parameter
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "w"], ["y"], transB=1),
             helper.make_node("Reshape", ["y", "shape"], ["z"])]
    inits = [_w("w", (16, 16)), numpy_helper.from_array(torch.tensor([-1], dtype=torch.int64).numpy(), "shape")]
    m = _model(nodes, [_f("x", ["N", 16])], [_f("z", None)], inits)
    open_rep = ls.analyze_onnx(m)
    assert not open_rep.totals.complete and "N" in open_rep.graph.symbolic_dims
    assert any("unknown shape" in u.op for u in open_rep.coverage.uncounted)
    rep = ls.analyze_onnx(m, input_shapes={"N": 4})
    assert rep.totals.complete
    # two Gemms of 4 x 16 x 16 = 1,024 MACs each
    # the weight is read by two layers (here one per node): shared, counted once
    assert rep.totals.macs == 2_048 and rep.totals.params == 256 and rep.totals.shared_params == 256
    assert rep.graph.nodes[0].params == 256 and rep.graph.nodes[2].params == 0
    # liveness (bytes of [4, 16] float = 256): x live, h made (512), x and h... peak: x + h = 512 at
    # the first Gemm, h + r = 512, r + y = 512, y + z = 512 (z is a graph output)
    assert rep.graph.peak_activation_bytes == 512
    same = ls.analyze_onnx(m, input_shapes={"x": (4, 16)})
    assert same.totals.macs == 2_048
    with pytest.raises(ls.InputError, match="neither graph inputs"):
        ls.analyze_onnx(m, input_shapes={"batch": 4})


def test_auto_pad_is_resolved_into_pads():
    # SAME_UPPER, kernel 3, stride 2 on 7 columns: out = ceil(7/2) = 4, total pad = (4-1)*2 + 3 - 7
    # = 2 -> 1 before, 1 after
    node = helper.make_node("Conv", ["x", "w"], ["y"], strides=[2, 2], auto_pad="SAME_UPPER")
    m = _model([node], [_f("x", [1, 1, 7, 7])], [_f("y", None)], [_w("w", (1, 1, 3, 3))])
    n = ls.analyze_onnx(m).graph.nodes[0]
    assert n.attributes["pads"] == [1, 1, 1, 1] and n.outputs[0][1] == (1, 1, 4, 4)


def test_unknown_ops_are_uncounted_not_zero():
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="com.example")
    g = helper.make_graph([node], "g", [_f("x", [2, 2])], [_f("y", [2, 2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("com.example", 1)])
    rep = ls.analyze_onnx(m)
    assert not rep.totals.complete and rep.coverage.uncounted[0].op == "onnx.com.example.Frobnicate"


def test_external_data_outside_the_folder_is_refused(tmp_path):
    w = _w("w", (4, 4))
    w.data_location = TensorProto.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", "../../etc/passwd"
    w.ClearField("raw_data")
    m = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [_f("x", [2, 4])], [_f("y", None)], [w])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    with pytest.raises(ls.InputError, match="outside the model's folder"):
        ls.analyze_onnx(str(path))
    with pytest.raises(ls.InputError, match="no ONNX file"):
        ls.analyze_onnx(str(tmp_path / "missing.onnx"))


def test_exported_cnn_matches_the_pytorch_analysis(tmp_path):
    from layerscope.examples import small_cnn
    torch.manual_seed(0)
    m, x = small_cnn().eval(), torch.randn(1, 3, 32, 32)
    path = tmp_path / "cnn.onnx"
    torch.onnx.export(m, (x,), dynamo=True).save(str(path))
    rep, ref = ls.analyze_onnx(str(path)), ls.analyze(m, x)
    assert rep.totals.macs == ref.totals.macs and rep.totals.complete
    # the exporter folds each BatchNorm (16 weights + 16 biases) into its conv: 3 * 32 = 96 fewer
    assert ref.totals.params - rep.totals.params == 96
    # layers follow the module paths the exporter recorded
    assert {"stem", "block", "head", "head.2"} <= {r.path for r in rep.layers}
    assert rep.find("head.2")[0].macs == 160            # Linear(16, 10) on one row
    assert rep.graph.nodes[0].module == "stem.1"        # the conv, fused with stem.1's BatchNorm
    assert "BatchNorm2d" in rep.table() and rep.graph.histogram["Conv"] == 3


def test_node_table_sorts_and_totals(tmp_path, capsys):
    from layerscope.cli import main
    nodes = [helper.make_node("Gemm", ["x", "w"], ["h"], transB=1), helper.make_node("Relu", ["h"], ["y"])]
    m = _model(nodes, [_f("x", ["N", 16])], [_f("y", None)], [_w("w", (32, 16))])
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    g = ls.analyze_onnx(str(path), {"N": 2}).graph
    # Gemm reads x 2*16*4 = 128 + w 32*16*4 = 2,048 and writes 2*32*4 = 256; Relu reads and writes 256
    assert [n.op_type for n in g.nodes] == ["Gemm", "Relu"]
    assert [(n.costs.bytes_read, n.costs.bytes_written) for n in g.nodes] == [(2176, 256), (256, 256)]
    text = g.table(sort="write")
    assert "moved 2.88 KiB" in text and "Peak activations" in text   # 2,176 + 256 + 512 = 2,944 B
    assert g.to_csv(sort="read", top=1).splitlines()[1].startswith("0,")
    with pytest.raises(ls.InputError, match="sort must be"):
        g.table(sort="size")
    assert main(["onnx", str(path), "--input", "N=2", "--sort", "bytes", "--format", "json"]) == 0
    import json
    d = json.loads(capsys.readouterr().out)
    assert d["graph"]["nodes"][0]["macs"] == 2 * 16 * 32 and d["totals"]["macs"] == 1024
    assert main(["onnx", str(path), "--input", "N"]) == 1
    assert "expected NAME=DIMS" in capsys.readouterr().err
    # the summary command takes the file too (shapes as the file has them: N stays symbolic), and
    # the HTML page draws it like any report
    assert main(["summary", str(path), "--format", "html", "-o", str(tmp_path / "m.html")]) == 0
    assert "Gemm" in (tmp_path / "m.html").read_text()
    assert main(["summary", str(path), "--input-size", "2,16"]) == 1
    assert "layerscope onnx FILE --input" in capsys.readouterr().err


def _rand(name, shape, seed):
    g = torch.Generator().manual_seed(seed)
    return numpy_helper.from_array((torch.rand(shape, generator=g) - 0.5).numpy(), name)


def test_tiling_gemm_keeps_macs_and_values():
    # Gemm x[3, 100] @ W[130, 100]^T + C[130] in blocks of (2, 64, 64): M -> 2+1, K -> 64+36,
    # N -> 64+64+2: 2 * 2 * 3 = 12 block Gemms, 6 Sums of 2 pieces
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], transB=1, name="fc")
    m = _model([node], [_f("x", [3, 100])], [_f("y", [3, 130])], [_rand("w", (130, 100), 1), _rand("c", (130,), 2)])
    before = m.SerializeToString()
    res = ls.onnx_tile(m, block=(2, 64, 64), verify=True)
    assert m.SerializeToString() == before                # the caller's model is not touched
    assert res.tiled == ["fc"] and res.blocks == 12 and res.skipped == [] and res.checked
    a, b = ls.analyze_onnx(m), ls.analyze_onnx(res.model)
    # MACs 3 * 100 * 130 = 39,000 either way; FLOPs 2 * 39,000 + 390 bias adds = 78,390 before;
    # after, + the Sums: (2 - 1) pieces added per output element = 3 * 130 = 390 -> 78,780
    assert a.totals.macs == b.totals.macs == 39_000
    assert (a.totals.flops, b.totals.flops) == (78_390, 78_780)
    assert b.graph.histogram["Gemm"] == 12 and b.graph.histogram["Sum"] == 6
    assert res.verified["mse"] < 1e-10 and res.verified["max_abs_error"] < 1e-5
    # transposed A, alpha and beta: the same values
    node = helper.make_node("Gemm", ["x", "w", "c"], ["y"], transA=1, alpha=0.5, beta=2.0)
    m2 = _model([node], [_f("x", [100, 3])], [_f("y", None)], [_rand("w", (100, 130), 3), _rand("c", (130,), 4)])
    assert ls.onnx_tile(m2, block=(2, 64, 64), verify=True).verified["mse"] < 1e-10


def test_tiling_batched_matmul_and_what_it_skips(tmp_path, capsys):
    from layerscope.cli import main
    # [2, 5, 70] @ [70, 33] in blocks (4, 64, 16): M 4+1, K 64+6, N 16+16+1 -> 12 blocks;
    # MACs 2 * 5 * 70 * 33 = 23,100
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    m = _model([node], [_f("x", [2, 5, 70])], [_f("y", [2, 5, 33])], [_rand("w", (70, 33), 5)])
    res = ls.onnx_tile(m, block=(4, 64, 16), verify=True)
    assert res.blocks == 12 and res.checked and ls.analyze_onnx(res.model).totals.macs == 23_100
    assert res.verified["mse"] < 1e-10
    dyn = _model([node], [_f("x", ["B", 5, 70])], [_f("y", None)], [_rand("w", (70, 33), 5)])
    skipped = ls.onnx_tile(dyn)
    assert skipped.tiled == [] and "not static" in skipped.skipped[0][1]
    assert ls.onnx_tile(dyn, input_shapes={"B": 2}).blocks == 2      # K 64+6, N 33 < 64, M 5 < 64
    with pytest.raises(ls.InputError, match="block must be"):
        ls.onnx_tile(m, block=(0, 1, 1))
    src, out = tmp_path / "m.onnx", tmp_path / "t.onnx"
    src.write_bytes(m.SerializeToString())
    assert main(["onnx-tile", str(src), str(out), "--block", "4,64,16", "--verify"]) == 0
    text = capsys.readouterr().out
    assert "into 12 blocks" in text and "MSE" in text and out.exists()


def test_if_loop_and_scan_subgraphs():
    from onnx import numpy_helper as nh
    w = _rand("w", (8, 8), 7)
    # Loop: 5 trips of x @ w with x [2, 8]: 2 * 8 * 8 = 128 MACs per iteration -> 640
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("MatMul", ["x_in", "w"], ["x_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []), _f("x_in", [2, 8])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []), _f("x_out", [2, 8])])
    trips = nh.from_array(torch.tensor(5, dtype=torch.int64).numpy(), "trips")
    cond = nh.from_array(torch.tensor(True).numpy(), "cond")
    loop = helper.make_node("Loop", ["trips", "cond", "x"], ["y"], body=body)
    rep = ls.analyze_onnx(_model([loop], [_f("x", [2, 8])], [_f("y", [2, 8])], [w, trips, cond]))
    n = rep.graph.nodes[0]
    assert rep.totals.macs == 640 and n.attributes["trip_count"] == 5 and n.attributes["iteration_macs"] == 128
    # a trip count that is an input: per-iteration cost shown, the node uncounted (never a zero)
    loop2 = helper.make_node("Loop", ["m", "cond", "x"], ["y"], body=body)
    m2 = _model([loop2], [_f("x", [2, 8]), helper.make_tensor_value_info("m", TensorProto.INT64, [])],
                [_f("y", [2, 8])], [w, cond])
    rep2 = ls.analyze_onnx(m2)
    assert not rep2.totals.complete and rep2.graph.nodes[0].attributes["iteration_macs"] == 128
    # If: then = MatMul (128 MACs), else = Add (16 FLOPs): the costlier branch counts, both shown
    then = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["t"])], "then", [], [_f("t", [2, 8])])
    other = helper.make_graph([helper.make_node("Add", ["x", "x"], ["e"])], "else", [], [_f("e", [2, 8])])
    iff = helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)
    rep3 = ls.analyze_onnx(_model([iff], [_f("x", [2, 8]), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
                                  [_f("y", [2, 8])], [w]))
    a = rep3.graph.nodes[0].attributes
    assert rep3.totals.macs == 128 and (a["then_macs"], a["else_flops"], a["counted_branch"]) == (128, 16, "then")
    # Scan over axis 0 of a [4, 2, 8] sequence: 4 iterations of [2, 8] @ [8, 8] -> 512 MACs
    sbody = helper.make_graph([helper.make_node("MatMul", ["s_in", "w"], ["s_out"])], "sbody",
                              [_f("s_in", [2, 8])], [_f("s_out", [2, 8])])
    scan = helper.make_node("Scan", ["seq"], ["out"], body=sbody, num_scan_inputs=1)
    rep4 = ls.analyze_onnx(_model([scan], [_f("seq", [4, 2, 8])], [_f("out", [4, 2, 8])], [w]))
    assert rep4.totals.macs == 512 and rep4.graph.nodes[0].attributes["trip_count"] == 4


def test_a_model_over_2gb_with_external_data_is_analysed_without_reading_it(tmp_path):
    # a 65,536 x 65,536 float weight is 16 GiB: kept in an external file that does not even exist;
    # the analysis needs its dims only
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[65_536, 65_536])
    w.data_location = TensorProto.EXTERNAL
    for k, v in (("location", "weights.bin"), ("offset", "0"), ("length", str(65_536 ** 2 * 4))):
        e = w.external_data.add()
        e.key, e.value = k, v
    m = _model([helper.make_node("Gemm", ["x", "w"], ["y"])], [_f("x", [1, 65_536])], [_f("y", None)], [w])
    path = tmp_path / "big.onnx"
    path.write_bytes(m.SerializeToString())
    rep = ls.analyze_onnx(str(path))
    # 1 x 65,536 x 65,536 = 4,294,967,296 MACs; the weight: 4,294,967,296 params, 16 GiB
    assert rep.totals.macs == 65_536 ** 2 and rep.totals.params == 65_536 ** 2
    assert rep.totals.param_bytes == 16 * 2 ** 30


def _scoped_norm(name, x, out, scope, weight):
    """A LayerNormalization as torch.onnx's dynamo export writes it: its module scope in the metadata."""
    node = helper.make_node("LayerNormalization", [x, weight + ".weight", weight + ".bias"], [out], name=name, axis=-1)
    for key, value in (("pkg.torch.onnx.name_scopes", repr(["", scope, name])),
                       ("pkg.torch.onnx.class_hierarchy", repr(["Sequential", "LayerNorm", "aten.layer_norm"]))):
        p = node.metadata_props.add()
        p.key, p.value = key, value
    return node


@pytest.mark.parametrize("second_reader, producer, noted", [("3", "pytorch", True),    # merged: 3 reads 1.weight
                                                             ("1", "pytorch", False),   # one module called twice
                                                             ("3", "other", False)])    # not torch's exporter
def test_shared_initializers_the_exporter_merged_are_explained(second_reader, producer, noted):
    # issue 58 item 6: nn.Sequential(Linear, LayerNorm(8), Linear, LayerNorm(8)) exported with dynamo=True
    # has one '1.weight'/'1.bias' read by both norms (onnx_ir's DeduplicateInitializersPass merges equal
    # initializers of <= 1024 elements): the summary said "Shared params 16" (2 x 8), the PyTorch model
    # has none, and nothing said why. Written here by hand as the exporter writes it (no 20 s export).
    nodes = [_scoped_norm("ln", "x", "h", "1", "1"), _scoped_norm("ln_1", "h", "y", second_reader, "1")]
    m = _model(nodes, [_f("x", [2, 8])], [_f("y", [2, 8])], [_w("1.weight", [8]), _w("1.bias", [8])])
    m.producer_name = producer
    rep = ls.analyze_onnx(m)
    assert rep.totals.params == 16 and rep.totals.shared_params == (16 if second_reader == "3" else 0)
    notes = [n for n in rep.notes if "merges initializers of equal values" in n]
    assert len(notes) == noted
    if noted:
        assert notes[0].startswith("16 of the shared params are 2 initializers of at most 1,024 elements")
        assert "('1.weight' by '3')" in notes[0] and "Note" in rep.table()
