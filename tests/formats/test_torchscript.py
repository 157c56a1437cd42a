"""TorchScript analysis: the same records as analyze() on the nn.Module it came from, control
flow run as the graph says, safe loading and clear errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.cli import main
from layerscope.examples import small_cnn

from ..helpers import assert_unchanged, snapshot

# torch 2.13 deprecates torch.jit.trace/script/load with a DeprecationWarning per call, torch 2.14 with a
# FutureWarning: the tests make TorchScript models on purpose, so exactly those messages are ignored here,
# nothing else (and the tracer's own TracerWarnings about the models traced here)
pytestmark = [pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning"),
              pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:FutureWarning"),
              pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning"),
              # transformers' own, raised while the tracer walks a GPT-2's attributes
              pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")]


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


def _traced(m, *inputs, tmp_path=None, **kw):
    """torch.jit.trace, saved and loaded back as a user would hand layerscope a .pt file."""
    t = torch.jit.trace(m, inputs, **kw)
    if tmp_path is None:
        return t
    path = tmp_path / "m.pt"
    t.save(str(path))
    return str(path)


def test_traced_tiny_gpt_position_ids_from_a_shape(tmp_path, capsys):
    """Regression (issue 18 item 5): ``torch.arange(ids.shape[1])`` traces to prim::NumToTensor, which
    the interpreter made a float tensor, so the position embedding failed ('Expected tensor for
    argument #1 'indices' to have one of the following scalar types: Long, Int')."""
    from layerscope.examples import tiny_gpt
    torch.manual_seed(0)
    m, ids = tiny_gpt().eval(), torch.randint(0, 1000, (1, 32))
    path = _traced(m, ids, tmp_path=tmp_path)
    rep, ref = ls.analyze_torchscript(path, ids), ls.analyze(m, ids)
    # by hand, dim 64, 4 heads of 16, S = 32, vocab 1000, 2 blocks:
    #   per block: qkv 32*64*192 = 393,216; causal SDPA counted dense 4*32*32*(16+16) = 131,072;
    #   proj 32*64*64 = 131,072; mlp 2*32*64*256 = 1,048,576 -> 1,703,936; x2 = 3,407,872
    #   tied head 32*64*1000 = 2,048,000 -> 5,455,872 MACs
    # params: tok 64,000 + pos 64*64 = 4,096 + 2 * (ln 128 + qkv 12,480 + proj 4,160 + ln 128 +
    #   mlp 16,640 + 16,448 = 49,984) + ln 128 = 168,192 (the head is tied to tok: counted once)
    assert rep.totals.macs == ref.totals.macs == 5_455_872
    assert rep.totals.params == ref.totals.params == 168_192
    # (FLOPs differ by 2: the trace records ``d // self.heads`` as two tensor floor_divides on
    # NumToTensor values, which the eager model computes in Python)
    assert main(["summary", path, "--input-ids", "1,32", "--format", "json"]) == 0
    import json
    out = json.loads(capsys.readouterr().out)
    assert out["totals"]["macs"] == 5_455_872


def test_num_to_tensor_dtypes_match_torchscript():
    """prim::NumToTensor gives int64 for an int, float64 for a float, bool for a bool, as the
    TorchScript interpreter does (at::scalar_to_tensor); float32 for all was the bug."""
    from layerscope.formats.torchscript import _num_to_tensor
    got = [(_num_to_tensor(v).dtype, _num_to_tensor(v).item()) for v in (3, 2.5, True)]
    assert got == [(torch.int64, 3), (torch.float64, 2.5), (torch.bool, True)]


@pytest.mark.parametrize("name", ["small_cnn", "tiny_gpt"])
def test_every_bundled_example_traced_matches_eager(name):
    from layerscope import examples
    factory = getattr(examples, name)
    assert set(examples.__all__) >= {name}
    torch.manual_seed(0)
    m = factory().eval()
    size, dtype = factory.input_size, getattr(factory, "input_dtype", torch.float32)
    x = torch.randint(0, 1000, size) if dtype == torch.long else torch.randn(size)
    rep, ref = ls.analyze_torchscript(_traced(m, x), x), ls.analyze(m, x)
    # hand-checked: small_cnn 5,161,120 MACs (the CLI golden above) and 432 + 32 + 2*2,304 + 2*32 +
    # 170 = 5,306 params; tiny_gpt 5,455,872 MACs and 168,192 params (derived in the test above)
    expected = {"small_cnn": (5_161_120, 5_306), "tiny_gpt": (5_455_872, 168_192)}[name]
    assert (rep.totals.macs, rep.totals.params) == (ref.totals.macs, ref.totals.params) == expected


def test_every_bundled_example_is_covered():
    from layerscope import examples
    factories = [n for n in examples.__all__ if n[0].islower()]
    assert sorted(factories) == ["small_cnn", "tiny_gpt"], "a new example: add it to the test above"


def test_hf_gpt2_n_embd_64_traced_matches_eager():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=64, n_positions=16, torchscript=True,
                     use_cache=False)
    m = GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 64, (1, 8))
    rep, ref = ls.analyze_torchscript(_traced(m, ids, strict=False), ids), ls.analyze(m, ids)
    # by hand, S = 8, E = 64, V = 64, 2 layers:
    #   per layer: c_attn 8*64*192 = 98,304; attention Q.K^T + P.V (dense) 2*8*8*64 = 8,192;
    #   c_proj 8*64*64 = 32,768; mlp 2*8*64*256 = 262,144 -> 401,408; x2 = 802,816
    #   lm_head 8*64*64 = 32,768 -> 835,584 MACs
    # params: wte 4,096 + wpe 16*64 = 1,024 + 2 * (ln 128 + c_attn 12,480 + c_proj 4,160 + ln 128 +
    #   c_fc 16,640 + c_proj 16,448 = 49,984) + ln_f 128 = 105,216 (lm_head tied to wte)
    assert (rep.totals.macs, rep.totals.params) == (ref.totals.macs, ref.totals.params) == (835_584, 105_216)


def test_loading_a_file_prints_no_jit_deprecation(tmp_path):
    """layerscope calls torch.jit.load on the user's behalf: the deprecation warning for it (torch 2.13:
    a DeprecationWarning, 2.14: a FutureWarning) must not reach the user (silenced only around that
    call, only that message)."""
    import warnings
    path = _traced(nn.Linear(4, 2), torch.randn(1, 4), tmp_path=tmp_path)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        rep = ls.analyze_torchscript(path, torch.randn(1, 4))
    assert rep.totals.macs == 8                       # 1 row * 4 * 2
    assert not [w for w in seen if "deprecated" in str(w.message)], [str(w.message) for w in seen]
