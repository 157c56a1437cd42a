"""TorchScript analysis: the same records as analyze() on the nn.Module it came from, control
flow run as the graph says, safe loading and clear errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.cli import main
from layerscope.examples import small_cnn

from .helpers import assert_unchanged, snapshot


@pytest.mark.parametrize("how", ["script", "trace"])
def test_script_and_trace_match_the_module(how, tmp_path):
    torch.manual_seed(0)
    m, x = small_cnn().eval(), torch.randn(1, 3, 32, 32)
    s = torch.jit.script(m) if how == "script" else torch.jit.trace(m, x)
    path = tmp_path / "m.pt"
    s.save(str(path))
    loaded = torch.jit.load(str(path))
    before = snapshot(loaded)
    rep, ref = ls.analyze_torchscript(loaded, x), ls.analyze(m, x)
    assert_unchanged(before, loaded)
    assert rep.model_name == "SmallCNN"
    for a, b in ((rep.totals.forward, ref.totals.forward), (rep.totals.params, ref.totals.params)):
        assert a == b
    # the same layer tree: paths, types, per-layer MACs and output shapes
    assert [(r.path, r.type, r.macs, r.outputs[0].shape if r.outputs else None) for r in rep.layers] == \
        [(r.path, r.type, r.macs, r.outputs[0].shape if r.outputs else None) for r in ref.layers]
    assert ls.analyze_torchscript(str(path), input_size=(1, 3, 32, 32)).totals.macs == ref.totals.macs


class Looped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, n: int):
        for _ in range(n):
            x = self.fc(x)
        if x.sum() > 1e9:          # never true here: the other branch is what runs
            x = x * 2
        return x


def test_control_flow_runs_as_the_graph_says():
    s = torch.jit.script(Looped())
    x = torch.randn(2, 8)
    # Linear(8, 8) on 2 rows: 2 * 8 * 8 = 128 MACs per iteration
    for n in (1, 3):
        rep = ls.analyze_torchscript(s, x, n)
        assert rep.totals.macs == 128 * n
        assert [r.call_index for r in rep.layers if r.path == "fc"] == list(range(n))


def test_hf_gpt2_traced_matches():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16, torchscript=True,
                     use_cache=False)
    m = GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 64, (1, 8))
    s = torch.jit.trace(m, (ids,), strict=False)
    rep, ref = ls.analyze_torchscript(s, ids), ls.analyze(m, ids)
    assert rep.totals.macs == ref.totals.macs and rep.totals.params == ref.totals.params
    # blocks sit in the ModuleList h, which the graph's hierarchy skips: paths come out whole
    assert [r.path for r in rep.layers] == [r.path for r in ref.layers]


def test_bad_input_and_files(tmp_path, capsys):
    s = torch.jit.script(small_cnn().eval())
    with pytest.raises(ls.InputError, match="takes 1 inputs"):
        ls.analyze_torchscript(s, torch.randn(1, 3, 32, 32), torch.randn(1))
    with pytest.raises(ls.ForwardError, match="stem"):
        ls.analyze_torchscript(s, torch.randn(1, 5, 32, 32))       # 5 channels into a 3-channel conv
    with pytest.raises(ls.InputError, match="needs example inputs"):
        ls.analyze_torchscript(s)
    bad = tmp_path / "x.pt"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ls.InputError, match="not a TorchScript archive"):
        ls.analyze_torchscript(str(bad), torch.randn(1))
    good = tmp_path / "m.pt"
    s.save(str(good))
    assert main(["summary", str(good), "--input-size", "1,3,32,32", "--format", "json"]) == 0
    import json
    assert json.loads(capsys.readouterr().out)["totals"]["macs"] == 5_161_120
