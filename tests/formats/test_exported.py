"""torch.export programs (.pt2), ep.module() and torch.compile'd modules (issue 22).

The exported graph is run node by node under the same recorder as analyze(); its numbers are checked
against analyze() of the eager model AND against hand-derived counts (conv and linear MACs below),
so that a bug shared by both paths cannot pass unseen."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

import layerscope
from layerscope.errors import InputError


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Sequential(nn.Linear(8, 4), nn.ReLU())

    def forward(self, x):
        y = self.pool(self.relu(self.bn(self.conv(x)))).mean((2, 3))
        return self.head(y)


class Block(nn.Module):
    """A ResNet basic block (torchvision's layout), with a 1x1 downsample when the shape changes."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)) \
            if stride != 1 or cin != cout else None

    def forward(self, x):
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return self.relu(y + (self.down(x) if self.down is not None else x))


class ResNetish(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
                                  nn.MaxPool2d(2))
        self.layer1 = nn.Sequential(Block(8, 8, 1), Block(8, 16, 2))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.layer1(self.stem(x))), 1))


def rows(rep):
    return [(r.path, r.type, r.depth, r.call_index, r.num_params, r.subtree_params,
             [s.shape for s in r.inputs], [s.shape for s in r.outputs], r.forward, r.kernel_size)
            for r in rep.layers]


def _small():
    torch.manual_seed(0)
    return Small().eval()


def test_static_export_matches_eager_and_hand_counts():
    m, x = _small(), torch.randn(2, 3, 8, 8)
    ep = torch.export.export(m, (x,))
    eager, exp = layerscope.analyze(m, x), layerscope.analyze_exported(ep, x)
    assert rows(exp) == rows(eager)
    assert exp.totals == eager.totals and exp.coverage == eager.coverage
    conv = next(r for r in exp.layers if r.path == "conv")
    # conv 3->8, k3x3 on 2x3x8x8: output 2x8x6x6 = 576 outputs, each 3*3*3 = 27 MACs -> 15552
    assert conv.forward.macs == 2 * 8 * 6 * 6 * 27 == 15552
    assert conv.num_params == 8 * 3 * 9 + 8 and conv.kernel_size == (3, 3)
    # Linear 8->4 on a batch of 2: 2*8*4 = 64 MACs
    assert next(r for r in exp.layers if r.path == "head.0").forward.macs == 64
    assert exp.totals.forward.macs == 15552 + 64
    assert [r.path for r in exp.layers] == ["", "conv", "bn", "relu", "pool", "head", "head.0", "head.1"]
    assert exp.model_name == "Small" and exp.layers[0].type == "Small"
    # per-layer self costs add up to the totals
    assert sum(r.forward.macs for r in exp.layers) == exp.totals.forward.macs
    assert sum(r.forward.flops for r in exp.layers) == exp.totals.forward.flops


def test_dynamic_batch_dim_takes_the_given_size(tmp_path):
    m = _small()
    ep = torch.export.export(m, (torch.randn(2, 3, 8, 8),),
                             dynamic_shapes=({0: torch.export.Dim("batch")},))
    x5 = torch.randn(5, 3, 8, 8)
    exp, eager = layerscope.analyze_exported(ep, x5), layerscope.analyze(m, x5)
    assert rows(exp) == rows(eager) and exp.totals == eager.totals
    # batch 5: 5*8*6*6 outputs x 27 MACs
    assert next(r for r in exp.layers if r.path == "conv").forward.macs == 5 * 8 * 36 * 27
    # saved and loaded: without inputs, the example inputs stored in the program (batch 2) are used
    path = tmp_path / "small.pt2"
    torch.export.save(ep, str(path))
    loaded = layerscope.analyze_exported(str(path))
    assert rows(loaded) == rows(layerscope.analyze(m, torch.randn(2, 3, 8, 8)))
    assert next(r for r in loaded.layers if r.path == "conv").forward.macs == 2 * 8 * 36 * 27
    # input_size builds the inputs; the symbolic batch takes its size
    sized = layerscope.analyze_exported(str(path), input_size=(3, 3, 8, 8))
    assert sized.totals.forward.macs == 3 * 8 * 36 * 27 + 3 * 8 * 4


def test_unknown_symbolic_dim_is_named_never_zero():
    ep = torch.export.export(_small(), (torch.randn(2, 3, 8, 8),),
                             dynamic_shapes=({0: torch.export.Dim("batch")},))
    ep._example_inputs = None      # a program saved without example inputs
    with pytest.raises(InputError, match="dim 0 of input 'x' is symbolic"):
        layerscope.analyze_exported(ep)


def test_static_dim_mismatch_and_bad_file(tmp_path):
    ep = torch.export.export(_small(), (torch.randn(2, 3, 8, 8),))
    with pytest.raises(InputError, match="static dim 0 of 2"):
        layerscope.analyze_exported(ep, torch.randn(3, 3, 8, 8))
    bad = tmp_path / "bad.pt2"
    bad.write_bytes(b"not a zip")
    with pytest.raises(InputError, match="not a torch.export program"):
        layerscope.analyze_exported(str(bad))
    with pytest.raises(InputError, match="no torch.export file"):
        layerscope.analyze_exported(str(tmp_path / "missing.pt2"))


def test_analyze_routes_program_module_and_compiled():
    m, x = _small(), torch.randn(2, 3, 8, 8)
    ep = torch.export.export(m, (x,))
    eager = layerscope.analyze(m, x)
    assert rows(layerscope.analyze(ep, x)) == rows(eager)
    # ep.module() refuses eval(): analyze() runs it as exported, with a note (was NotImplementedError)
    gm = ep.module()
    rep = layerscope.analyze(gm, x)
    assert rows(rep) == rows(eager) and rep.totals == eager.totals
    assert any("mode='same'" in n for n in rep.notes)
    with pytest.raises(InputError, match="pass mode='same'"):
        layerscope.analyze(gm, x, mode="train")
    # torch.compile: the original module is analysed (nothing is compiled: analyze never calls it)
    compiled = torch.compile(m, backend="eager")   # eager backend: no inductor import
    crep = layerscope.analyze(compiled, x)
    assert rows(crep) == rows(eager) and any("_orig_mod" in n for n in crep.notes)


def test_meta_device_and_state_unchanged():
    torch.manual_seed(0)
    m = Small().train()          # BatchNorm in train mode: the exported graph updates running stats
    x = torch.randn(2, 3, 8, 8)
    ep = torch.export.export(m, (x,))
    before = {k: v.clone() for k, v in ep.state_dict.items()}
    real = layerscope.analyze_exported(ep, x)
    assert all(torch.equal(before[k], v) for k, v in ep.state_dict.items())
    meta = layerscope.analyze_exported(ep, x, device="meta")
    assert meta.totals.forward == real.totals.forward
    assert all(torch.equal(before[k], v) for k, v in ep.state_dict.items())
    assert real.totals.forward.macs == 15552 + 64


def test_memory_and_partition_refuse_in_one_line_and_split_a_report():
    m = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    x = torch.randn(2, 8)
    ep = torch.export.export(m, (x,))
    for call in (lambda: layerscope.memory(ep.module(), x), lambda: layerscope.partition(ep, x, stages=2)):
        with pytest.raises(InputError) as e:
            call()
        assert "\n" not in str(e.value) and "exported program" in str(e.value)
    plan = layerscope.partition(layerscope.analyze_exported(ep, x), stages=2)
    assert plan == plan and len(plan.stages) == 2


def test_resnet_style_cnn_agrees_exactly():
    torch.manual_seed(0)
    m, x = ResNetish().eval(), torch.randn(1, 3, 32, 32)
    eager, exp = layerscope.analyze(m, x), layerscope.analyze_exported(torch.export.export(m, (x,)))
    assert rows(exp) == rows(eager) and exp.totals == eager.totals and exp.coverage.complete
    # stem conv 3->8 k3 pad1 on 32x32: 8*32*32 outputs x 27 MACs = 221184
    assert next(r for r in exp.layers if r.path == "stem.0").forward.macs == 8 * 32 * 32 * 27


def test_gpt2_agrees_with_eager():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=100, n_positions=32,
                                  use_cache=False, attn_implementation="eager")
    m = transformers.GPT2Model(cfg).eval()
    ids = torch.randint(0, 100, (2, 16))
    eager = layerscope.analyze(m, ids)
    exp = layerscope.analyze_exported(torch.export.export(m, (ids,)))
    e = {(r.path, r.call_index): r for r in eager.layers}
    x = {(r.path, r.call_index): r for r in exp.layers}
    assert list(e) == list(x)                       # the same layer tree, in the same order
    for k in e:
        assert x[k].type == e[k].type and x[k].num_params == e[k].num_params
        assert x[k].subtree_params == e[k].subtree_params and x[k].outputs[0] == e[k].outputs[0]
        if k[0]:   # every module below the root: the same ops, so the same MACs, FLOPs and bytes
            assert x[k].forward == e[k].forward, k
    assert exp.totals.params == eager.totals.params
    # 2 layers x (c_attn 64->192, c_proj 64->64, c_fc 64->256, mlp c_proj 256->64) on 32 tokens,
    # + Q.K^T and P.V: 4 heads x 16x16x16 x 2 per sequence
    per_layer = 32 * 64 * (192 + 64 + 256) + 32 * 256 * 64 + 2 * 2 * 4 * 16 * 16 * 16
    assert exp.totals.forward.macs == eager.totals.forward.macs == 2 * per_layer
    # attn_implementation="eager": with SDPA, eager transformers passes no mask (is_causal) while the
    # traced model passes the materialised one, so each attention layer has the mask's elementwise
    # FLOPs more in the export (same MACs); that is the model taking another path, not the analysis.
    # What cannot match: the root's own ops. Traced, transformers builds the causal mask by another
    # code path (its tracing branch materialises it with different elementwise ops than eager does),
    # and module inputs it never reads (position ids) leave no edge in the graph.
    assert exp.layers[0].forward.macs == eager.layers[0].forward.macs == 0


def test_cli_summary_of_a_pt2(tmp_path, capsys):
    from layerscope.cli import main
    ep = torch.export.export(_small(), (torch.randn(2, 3, 8, 8),),
                             dynamic_shapes=({0: torch.export.Dim("batch")},))
    path = tmp_path / "small.pt2"
    torch.export.save(ep, str(path))
    assert main(["summary", str(path), "--input-size", "4,3,8,8", "--format", "json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["model"]["options"]["format"] == "torch.export"
    # batch 4: conv 4*8*36*27 + linear 4*8*4 (was: "not a model spec")
    assert data["totals"]["macs"] == 4 * 8 * 36 * 27 + 4 * 8 * 4


def test_tied_weights_stay_shared_after_save_and_load(tmp_path):
    """Regression: torch.export.load gives GPT-2's tied lm_head/wte weights as two Parameters on one
    storage; counted twice, the .pt2 showed 16,384 (= 256 x 64) parameters too many."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4, vocab_size=256, n_positions=32, use_cache=False)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 256, (1, 16))
    path = tmp_path / "gpt2.pt2"
    torch.export.save(torch.export.export(m, (ids,)), str(path))
    eager, exp = layerscope.analyze(m, ids), layerscope.analyze_exported(str(path))
    assert exp.totals.params == eager.totals.params == sum(p.numel() for p in m.parameters())
    assert exp.totals.shared_params == eager.totals.shared_params == 256 * 64
    assert exp.totals.forward.macs == eager.totals.forward.macs


def test_cli_pt2_other_commands_say_what_the_format_supports(tmp_path, capsys):
    # memory/split/profile of a .pt2 said "not a model spec"; now one line naming what .pt2 supports
    from layerscope.cli import main
    ep = torch.export.export(nn.Sequential(nn.Linear(4, 2)), (torch.randn(1, 4),))
    path = tmp_path / "m.pt2"
    torch.export.save(ep, str(path))
    for cmd in (["memory", str(path)], ["split", str(path), "--stages", "2"], ["profile", str(path)]):
        assert main(cmd) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "supports `summary` only" in err[0]
