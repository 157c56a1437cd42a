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
    # three forwards counted, as FlopsProfiler counts them (issue 58): 3 x 63,252 = 189,756
    assert p.steps == 3 and p.get_total_flops(as_string=True) == "189.76 K"


def test_profiler_getters_count_the_forwards_that_ran(tmp_path):
    """Issue 58 item 7: the getters analysed one forward on meta copies of the first step's inputs, where
    a branch on the inputs' values is a guess (a meta tensor has no values) and only one forward counts.
    Now, as FlopsProfiler: every forward since start_profile, counted as it ran. Hand counts: Linear(8, 4)
    on (b, 8) is 32 b MACs, 2 x 32 b + 4 b bias adds = 68 b FLOPs; the branch taken on (x > 0).all()
    adds a Linear(4, 4): 16 b MACs, 36 b FLOPs; the test itself, x > 0 and .all(), 1 FLOP per element
    each: 2 x 8 b."""
    class Gate(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 4), nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            return self.b(h) if bool((x > 0).all()) else h      # a branch on the inputs' values

    m = Gate()
    p = ls.Profiler(m)
    with p:
        m(-torch.ones(2, 8))             # not taken: 64 MACs, 136 + 32 = 168 FLOPs
        m(torch.ones(3, 8))              # taken: 96 + 48 = 144 MACs, 204 + 108 + 48 = 360 FLOPs
    assert p.steps == 2
    assert (p.get_total_macs(), p.get_total_flops()) == (64 + 144, 168 + 360)          # 208, 528
    ff = FlopsProfiler(m)                # the same numbers as DeepSpeed's front end counts
    ff.start_profile()
    m(-torch.ones(2, 8))
    m(torch.ones(3, 8))
    assert (ff.get_total_macs(), ff.get_total_flops()) == (208, 528)
    ff.end_profile()
    # the printed profile divides those FLOPs by the time of the same two forwards (as FlopsProfiler),
    # not by one step's median: its latency is the counter's sum over the forwards
    from layerscope.render.deepspeed import duration_to_string
    out = tmp_path / "p.txt"
    p.print_model_profile(output_file=str(out))
    text = out.read_text()
    assert f"{'fwd flops per GPU: ':<70}  {'528 ':<8}" in text
    assert f"{'fwd latency: ':<70}  {duration_to_string(p._loop.counter.seconds['']):<8}" in text
    p.end_profile()
    assert (p.get_total_macs(), p.get_total_flops()) == (0, 0)
    with pytest.raises(ls.InputError, match="costs=False"):
        ls.Profiler(m, costs=False).get_total_flops()


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
    assert p.steps == 3 and [len(s[0]) for s in p._loop.steps] == [6, 6, 6]   # 6 module calls per forward


# ---- FlopsProfiler as DeepSpeed's: counts over every forward since start_profile; ds_engine's sizes --

# nn.Linear(8, 4) on (batch, 8): MACs batch x 8 x 4; FLOPs 2 x MACs + batch x 4 bias adds.
#   batch 2: 64 MACs, 128 + 8 = 136 FLOPs;  batch 3: 96 MACs, 192 + 12 = 204 FLOPs.


def test_flops_profiler_adds_up_every_forward_since_start():
    m = nn.Linear(8, 4)
    before = state(m)
    prof = FlopsProfiler(m)
    prof.start_profile()
    for b in (2, 2, 3):
        m(torch.randn(b, 8))
    assert (prof.get_total_macs(), prof.get_total_flops()) == (64 + 64 + 96, 136 + 136 + 204)   # 224, 476
    assert prof.get_total_duration() > 0
    prof.stop_profile()
    m(torch.randn(2, 8))                         # not counted: stopped, the counts kept
    assert prof.get_total_macs() == 224
    prof.start_profile()                          # starts again from zero
    assert prof.get_total_macs() == 0
    m(torch.randn(3, 8))
    assert (prof.get_total_macs(), prof.get_total_flops()) == (96, 204)
    prof.reset_profile()
    m(torch.randn(2, 8))
    assert prof.get_total_macs() == 64
    prof.end_profile()
    assert same_state(before, state(m))


def test_repeated_profiles_do_not_add_up():
    # SDPA on q, k, v of (2, 4, 16, 8): scores 2 x 4 x 16 x 16 = 2,048; Q.K^T and P.V 2,048 x 8 MACs each
    # = 32,768; FLOPs 2 x 32,768 + 2,048 x (1 scale + 5 softmax) = 77,824 (DeepSpeed: the matmuls only,
    # 65,536)
    class Attention(nn.Module):
        def forward(self, q, k, v):
            return nn.functional.scaled_dot_product_attention(q, k, v)

    m, qkv = Attention(), [torch.randn(2, 4, 16, 8) for _ in range(3)]
    prof = FlopsProfiler(m)
    seen = []
    for _ in range(3):
        prof.start_profile()
        m(*qkv)
        prof.stop_profile()
        seen.append((prof.get_total_flops(), prof.get_total_macs()))
        prof.end_profile()
    assert seen == [(77_824, 32_768)] * 3


def _engine(**kw):
    from types import SimpleNamespace
    e = dict(world_size=8, dp_world_size=None, seq_dp_world_size=4, mp_world_size=2, has_moe_layers=False,
             train_micro_batch_size_per_gpu=lambda: 2, wall_clock_breakdown=lambda: False)
    return SimpleNamespace(**{**e, **kw})


def _line(name, value):
    return f"{name:<70}  {value:<8}"


def test_print_model_profile_reads_the_engine_set_afterwards(capsys):
    m = nn.Linear(8, 4)                        # 36 params; one forward on (2, 8): 64 MACs, 136 FLOPs
    prof = FlopsProfiler(m)
    prof.ds_engine = _engine()                 # dp_world_size None: the sequence-data-parallel size shows
    prof.start_profile()
    m(torch.randn(2, 8))
    prof.print_model_profile(detailed=False)
    prof.end_profile()
    out = capsys.readouterr().out.splitlines()
    for name, value in (("world size: ", 8), ("data parallel size: ", 4), ("model parallel size: ", 2),
                        ("batch size per GPU: ", 2), ("params per GPU: ", "36"),
                        ("params of model = params per GPU * mp_size: ", "72"),       # 36 x 2
                        ("fwd flops of model = fwd flops per GPU * mp_size: ", "272 ")):  # 136 x 2
        assert _line(name, value) in out
    assert (prof.flops, prof.macs, prof.params) == (136, 64, 36)


def test_print_model_profile_with_the_engine_timers(capsys):
    class Timer:
        def __init__(self, ms):
            self.ms = ms

        def elapsed(self, reset):
            return self.ms

    ms = {"fwd": 10.0, "bwd": 20.0, "step": 5.0}
    m = nn.Linear(8, 4)
    prof = FlopsProfiler(m, ds_engine=_engine(mp_world_size=1, wall_clock_breakdown=lambda: True,
                                              timers=lambda name: Timer(ms[name])))
    prof.start_profile()
    m(torch.randn(2, 8))                       # 136 FLOPs
    prof.print_model_profile(detailed=False)
    prof.end_profile()
    out = capsys.readouterr().out.splitlines()
    for name, value in (("fwd latency: ", "10 ms"),
                        ("fwd FLOPS per GPU = fwd flops per GPU / fwd latency: ", "13.6 KFLOPS"),    # 136 / 0.01
                        ("bwd latency: ", "20 ms"),
                        ("bwd FLOPS per GPU = 2 * fwd flops per GPU / bwd latency: ", "13.6 KFLOPS"),  # 272 / 0.02
                        ("fwd+bwd FLOPS per GPU = 3 * fwd flops per GPU / (fwd+bwd latency): ", "13.6 KFLOPS"),
                        ("step latency: ", "5 ms"), ("iter latency: ", "35 ms"),
                        ("FLOPS per GPU = 3 * fwd flops per GPU / iter latency: ", "11.66 KFLOPS"),  # 408 / 0.035
                        ("samples/second: ", 457.14)):                 # 2 per GPU x 8 GPUs / 0.035 s
        assert _line(name, value) in out


def test_aggregated_profile_needs_a_started_profile(capsys):
    prof = FlopsProfiler(nn.Linear(8, 4))
    prof.print_model_aggregated_profile()
    assert "call this function after start_profile" in capsys.readouterr().out


def test_a_training_loop_s_figures_agree_with_get_model_profile():
    # DeepSpeed's tutorial form: profile one step of a training loop (forward, backward, optimizer step)
    # of a model in train mode, and get_model_profile (eval mode) on the same model. The Linear(4, 3) on
    # (2, 4): 24 MACs, 48 + 6 bias adds = 54 FLOPs in both modes. BatchNorm1d(3) on its (2, 3) output, 6
    # elements: in train mode with the batch's statistics, 6 x (4 statistics + 2 normalise + weight +
    # bias) = 48, + 1 for num_batches_tracked = 49; in eval with the running ones, 6 x (2 + 2) = 24.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.BatchNorm1d(3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    prof = FlopsProfiler(model)
    flops = []
    for step in range(3):
        if step == 1:
            prof.start_profile()
        loss = model(torch.randn(2, 4)).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step == 1:
            flops.append((prof.get_total_flops(), prof.get_total_macs()))
            prof.end_profile()
    assert flops == [(54 + 49, 24)]
    model.eval()
    assert get_model_profile(model, input_shape=(2, 4), print_profile=False, as_string=False)[:2] == (54 + 24, 24)
    assert model.training is False


def test_the_profiler_counts_the_forwards_as_they_ran():
    class Branchy(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 64)

        def forward(self, x):
            return self.a(x) if x.sum() > 0 else self.b(x)

    m = Branchy()
    before = state(m)
    prof = FlopsProfiler(m)
    prof.start_profile()
    m(torch.ones(2, 8))                 # a: 2 x 8 x 8 = 128 MACs
    m(-torch.ones(2, 8))                # the same shapes, the other branch, b: 2 x 8 x 64 = 1,024
    ls.analyze(m, torch.ones(2, 8))     # layerscope's own analysis of the model: not the user's forward
    get_model_profile(m, input_shape=(2, 8), print_profile=False)
    assert prof.get_total_macs() == 128 + 1_024
    prof.end_profile()
    assert same_state(before, state(m))


def test_the_profiler_names_ops_without_a_formula(tmp_path):
    @torch.library.custom_op("lstest_deepspeed::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4, bias=False)

        def forward(self, x):
            return twice(self.lin(x))

    m = Model()
    prof = FlopsProfiler(m)
    prof.start_profile()
    m(torch.ones(1, 4))
    assert prof.get_total_macs() == 16           # the Linear's; the custom op has no formula
    prof.print_model_profile(output_file=str(tmp_path / "p.txt"))
    prof.end_profile()
    assert "ops without a FLOP formula (not in MACs or flops):" in (tmp_path / "p.txt").read_text()
    assert "lstest_deepspeed.twice x1" in (tmp_path / "p.txt").read_text()
