"""layerscope.compat.deepspeed and Profiler's DeepSpeed getters (issue 21). Expected values by hand."""

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.compat.deepspeed import (FlopsProfiler, get_model_profile, macs_to_string, number_to_string,
                                         params_to_string)

from .models import CNN, same_state, state

# CNN on (2, 3, 8, 8):
#   conv 3->8 3x3 pad 1: 224 params; output 2*8*8*8 = 1,024 values x 27 = 27,648 MACs;
#        FLOPs 2 x 27,648 + 1,024 bias adds = 56,320
#   ReLU on 1,024 values: 1,024 FLOPs;  MaxPool 2x2 -> 256 outputs x 3 comparisons = 768 FLOPs
#   fc 128->10: 1,290 params; 2 x 128 x 10 = 2,560 MACs; FLOPs 2 x 2,560 + 20 bias adds = 5,140
#   Totals: 1,514 params, 30,208 MACs, 63,252 FLOPs.
#   (DeepSpeed's own table: 64,512 FLOPs: max-pool counted as its 2,048 inputs, F.linear's bias not at all.)
PARAMS, MACS, FLOPS = 1_514, 30_208, 63_252


def test_get_model_profile_readme_example(capsys):
    m = CNN()
    before = state(m)
    flops, macs, params = get_model_profile(model=m, input_shape=(2, 3, 8, 8))
    assert (flops, macs, params) == ("63.25 K", "30.21 KMACs", "1.51 K")
    out = capsys.readouterr().out
    assert same_state(before, state(m))
    for line in ("-------------------------- DeepSpeed Flops Profiler --------------------------",
                 "Profile Summary at step 1:", "Top 1 modules in terms of params, MACs or fwd latency at different model depths:",
                 "depth 0:", "    params      - {'CNN': '1.51 K'}", "    MACs        - {'CNN': '30.21 KMACs'}",
                 "    MACs        - {'Sequential': '27.65 KMACs'}", "    params      - {'Linear': '1.29 K'}",
                 "------------------------------ Detailed Profile per GPU ------------------------------"):
        assert line in out.splitlines()
    assert f"{'params per GPU: ':<70}  {'1.51 K':<8}" in out
    assert f"{'fwd MACs per GPU: ':<70}  30.21 KMACs" in out
    assert "  (fc): Linear(1.29 K = 85.2% Params, 2.56 KMACs = 8.47% MACs, " in out   # 1,290/1,514; 2,560/30,208
    assert "in_features=128, out_features=10, bias=True)" in out


def test_get_model_profile_numbers_and_errors(tmp_path):
    m = CNN()
    assert get_model_profile(m, args=[torch.randn(2, 3, 8, 8)], print_profile=False, as_string=False) == (FLOPS, MACS, PARAMS)
    path = tmp_path / "sub" / "profile.txt"
    get_model_profile(m, input_shape=(2, 3, 8, 8), output_file=str(path), detailed=False, warm_up=0)
    text = path.read_text()
    assert "fwd flops per GPU: " in text and "Detailed Profile" not in text
    for kwargs, match in ((dict(), "args and/or kwargs"), (dict(input_shape=[2, 3, 8, 8]), "input_shape"),
                          (dict(input_shape=(2, 3, 8, 8), mode="generate"), "mode"),
                          (dict(input_shape=(2, 3, 8, 8), ignore_modules=[nn.ReLU]), "ignore_modules")):
        with pytest.raises(ls.InputError, match=match):
            get_model_profile(m, print_profile=False, **kwargs)


def test_bert_from_config():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=16)
    m = transformers.BertModel(cfg)
    ids = torch.randint(0, 100, (1, 8))
    flops, macs, params = get_model_profile(m, kwargs={"input_ids": ids}, print_profile=False, as_string=False)
    # S=8 tokens, H=32, I=64: Q, K, V, O projections 4 x S x H x H = 32,768; Q.K^T and P.V S x S x H each
    # = 2 x 2,048; FFN 2 x S x H x I = 32,768; pooler (first token) H x H = 1,024; embeddings none.
    assert macs == 32_768 + 4_096 + 32_768 + 1_024 == 70_656
    assert params == sum(p.numel() for p in m.parameters())


def test_flops_profiler_training_loop_form(tmp_path):
    m = CNN()
    before = state(m)
    prof = FlopsProfiler(m)
    prof.start_profile()
    m(torch.randn(2, 3, 8, 8))
    assert prof.get_total_flops() == FLOPS and prof.get_total_macs(as_string=True) == "30.21 KMACs"
    assert prof.get_total_params(as_string=True) == "1.51 K" and prof.get_total_duration() > 0
    assert prof.get_total_duration(as_string=True).endswith("s")
    prof.print_model_profile(profile_step=1, output_file=str(tmp_path / "p.txt"))
    assert (prof.flops, prof.macs, prof.params) == (FLOPS, MACS, PARAMS)
    assert "Profile Summary at step 1:" in (tmp_path / "p.txt").read_text()
    prof.end_profile()
    assert same_state(before, state(m))       # no __flops__ attributes, no hooks left


def test_profiler_getters_do_not_record_their_own_analysis():
    # regression: the costs analysis behind get_total_flops() ran the model under the profiler's
    # hooks and was recorded as extra steps
    m = CNN()
    p = ls.Profiler(m)
    with p:
        m(torch.randn(2, 3, 8, 8))
        assert p.get_total_macs() == MACS and p.get_total_params() == PARAMS
        m(torch.randn(2, 3, 8, 8))
        m(torch.randn(2, 3, 8, 8))
    assert p.steps == 3 and p.get_total_flops(as_string=True) == "63.25 K"


def test_number_formats_match_deepspeed():
    assert number_to_string(63_252) == "63.25 K" and number_to_string(0) == "0 "
    assert macs_to_string(1.5e9) == "1.5 GMACs" and params_to_string(3_784_580) == "3.78 M"
    assert params_to_string(7e9) == "7 B" and number_to_string(0.0123) == "12.3 m"


def test_profiler_report_inside_the_loop_keeps_the_open_step():
    # regression: report() inside `with prof:` analysed the model under the profiler's own hooks,
    # recording the meta run's calls into the open step (IndexError in the step totals)
    m = CNN()
    p = ls.Profiler(m)
    with p:
        m(torch.randn(2, 3, 8, 8))
        m(torch.randn(2, 3, 8, 8))
        assert p.report().totals["flops"] == FLOPS
        m(torch.randn(2, 3, 8, 8))
    assert p.steps == 3 and [len(s[0]) for s in p._steps] == [6, 6, 6]   # 6 module calls per forward
