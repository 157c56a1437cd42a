"""Latency profiler: per-call structure, where backward time lands, self/inclusive sums, costs per
call, roofline, traces, the training-loop Profiler, and state left alone."""

from __future__ import annotations

import json
import time

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.capture.repeats import time_calls
from layerscope.analyses.roofline import Roofline, roofline_for
from layerscope.cli import main
from layerscope.examples import small_cnn
from layerscope.render.latency import _lanes, chrome_trace

from ..helpers import assert_unchanged, snapshot

CPU = torch.device("cpu")


class Twice(nn.Module):
    """One Linear called twice: two calls, two records."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.out = nn.Linear(16, 10)

    def forward(self, x):
        return self.out(torch.relu(self.fc(torch.relu(self.fc(x)))))


class _SlowBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 1.0

    @staticmethod
    def backward(ctx, g):
        time.sleep(0.05)
        return g


class Slow(nn.Module):
    def forward(self, x):
        return _SlowBackward.apply(x)


class SlowForward(nn.Module):
    def forward(self, x):
        time.sleep(0.03)
        return x + 1


def test_calls_self_times_and_costs():
    torch.manual_seed(0)
    m, x = Twice(), torch.randn(8, 16)
    before, rng = snapshot(m), torch.get_rng_state()
    rep = ls.profile(m, x, warmup=1, repeats=3, backward=True)
    assert_unchanged(before, m)
    assert torch.equal(rng, torch.get_rng_state()) and all(p.grad is None for p in m.parameters())
    assert [(r.path, r.call_index) for r in rep.layers] == [("", 0), ("fc", 0), ("fc", 1), ("out", 0)]
    out = rep.layers[3]
    # Linear(16, 10) on 8 rows: 8 x 16 x 10 = 1280 MACs -> 2560 FLOPs + 8 x 10 bias adds = 2640
    assert out.flops == 2640 and out.flops_per_second == pytest.approx(2640 / out.forward.median)
    # bytes: read x 8*16*4 = 512, weight 160*4 = 640, bias 10*4 = 40; write 8*10*4 = 320 -> 1512
    assert out.bytes_moved == 1512 and out.intensity == pytest.approx(2640 / 1512)
    assert all(r.forward.min >= 0 and r.backward.min >= 0 for r in rep.layers)
    # both calls of fc have a backward of their own (each call's nodes are its own)
    assert rep.layers[1].backward.max > 0 and rep.layers[2].backward.max > 0
    t = rep.totals
    assert t["forward_plain"] > 0 and t["backward_plain"] > 0 and t["runs"] == 3
    assert -1 < t["forward_overhead"] and t["forward_self_sum"] <= t["forward_instrumented"]
    assert rep.top(1, depth=1)[0].depth == 1
    per_depth = rep.top_per_depth(2)
    assert list(per_depth) == [1] and len(per_depth[1]) == 2
    assert per_depth[1][0].forward.median >= per_depth[1][1].forward.median
    assert "Top depth 1" in rep.table() and "Top depth" not in rep.table(top=0)


def test_totals_pair_each_repeat():
    from layerscope.capture.timing import CallTimes
    from layerscope.reports.latency import latency_totals
    root = CallTimes("", "M", 0, 0, None, [1], forward=[1.0, 2.0, 3.0])
    kid = CallTimes("a", "L", 1, 0, 0, [], forward=[0.5, 0.5, 0.5])
    t = latency_totals([root, kid], {"forward": [1.1, 2.2, 3.0]}, {"forward": [1.0, 2.0, 3.0]}, False)
    # per-repeat ratios 1.1/1.0 - 1 = 0.1, 2.2/2.0 - 1 = 0.1, 3.0/3.0 - 1 = 0: median 0.1
    assert t["forward_overhead"] == pytest.approx(0.1)
    # medians: instrumented 2.2, uninstrumented 2.0, self sum = the root's 2.0 (the child's 0.5 inside)
    assert (t["forward_instrumented"], t["forward_plain"], t["forward_self_sum"]) == (2.2, 2.0, 2.0)
    # spread of the uninstrumented runs: quartiles 1.5 and 2.5 (inclusive method) over median 2.0
    assert t["forward_spread"] == pytest.approx(0.5) and t["runs"] == 3


def test_self_times_add_up_to_the_root_in_every_repeat():
    m, x = small_cnn(), torch.randn(2, 3, 32, 32)
    calls, plain, hooked = time_calls(m, lambda: m(x), lambda o: o.sum(), device=CPU, warmup=1, repeats=4)
    assert len(plain["forward"]) == len(hooked["backward"]) == 4
    for r in range(4):
        for phase in ("forward", "backward"):
            self_sum = sum(getattr(c, phase)[r] - sum(getattr(calls[k], phase)[r] for k in c.children)
                           for c in calls)
            assert self_sum == pytest.approx(getattr(calls[0], phase)[r], rel=1e-9)
            for c in calls:    # a parent holds its children: no negative self time
                assert getattr(c, phase)[r] >= sum(getattr(calls[k], phase)[r] for k in c.children) - 1e-12
            # the root's time is within the measured run with hooks
            assert getattr(calls[0], phase)[r] <= hooked[phase][r]
    for p in m.parameters():
        p.grad = None


def test_backward_time_lands_in_the_module_whose_forward_made_it():
    # a 50 ms sleep in the backward of "mid.slow" and a 30 ms sleep in the forward of "mid.late":
    # each is the largest self time of its phase, and it is at least the sleep
    m = nn.Sequential(nn.Linear(8, 8), nn.Sequential(Slow(), nn.ReLU(), SlowForward()), nn.Linear(8, 2))
    rep = ls.profile(m, torch.randn(4, 8), warmup=0, repeats=2, backward=True)
    by = {r.path: r for r in rep.layers}
    assert rep.top(1, by="backward_self")[0].path == "1.0"
    assert by["1.0"].backward_self.min >= 0.05 and by["1"].backward.min >= 0.05
    assert rep.top(1, by="forward_self")[0].path == "1.2"
    assert by["1.2"].forward_self.min >= 0.03
    # the first layer's input needs no gradient: its weight gradients are still its own
    assert by["0"].backward.min > 0


def test_backward_of_a_model_output_root_and_a_frozen_part():
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
    m.transformer.wte.weight.requires_grad_(False)    # lm_head shares it: frozen both ways
    ids = torch.randint(0, 64, (1, 8))
    before = snapshot(m)
    rep = ls.profile(m, ids, warmup=0, repeats=2, backward=True)
    assert_unchanged(before, m)
    by = {r.path: r for r in rep.layers}
    assert rep.layers[0].type == "GPT2LMHeadModel" and rep.layers[0].backward.min > 0
    assert by["transformer.h.0.attn.c_attn"].backward.min > 0
    t = rep.totals
    assert 0 < t["backward_self_sum"] <= t["backward_instrumented"]


def test_profile_refuses_what_it_cannot_time():
    with pytest.raises(ls.InputError, match="no data"):
        ls.profile(nn.Linear(4, 4, device="meta"), torch.randn(2, 4, device="meta"))
    with pytest.raises(ls.InputError, match="repeats"):
        ls.profile(nn.Linear(4, 4), torch.randn(2, 4), repeats=0)
    with pytest.raises(ls.InputError, match="no built-in peaks"):
        ls.profile(nn.Linear(4, 4), torch.randn(2, 4), roofline="Z80")


def test_roofline_classes_and_distance():
    roof = Roofline("toy", peak_flops=100e9, peak_bandwidth=10e9, source="given")
    assert roof.ridge == 10.0                       # 100e9 / 10e9 FLOP per byte
    # Linear(16, 10) on 8 rows: 2640 FLOPs over 1512 bytes = 1.746 FLOP/B < 10: memory-bound;
    # attainable 1.746 * 10e9 = 17.46 GFLOP/s; done in 1 us = 2.64 GFLOP/s -> 15.1% of the roof
    assert roof.bound(2640 / 1512) == "memory"
    assert roof.fraction(2640, 1512, 1e-6) == pytest.approx(2.64e9 / (2640 / 1512 * 10e9))
    # a 1024^3 matmul in fp32: 2 * 1024^3 FLOPs over 3 * 4 MiB = 170.7 FLOP/B > 10: compute-bound
    assert roof.bound(2 * 1024 ** 3 / (3 * 4 * 2 ** 20)) == "compute"
    assert roof.attainable(1000.0) == 100e9
    h100 = roofline_for("H100", CPU, torch.bfloat16)
    assert (h100.peak_flops, h100.peak_bandwidth) == (989.4e12, 3.35e12)
    assert roofline_for("H200", CPU, torch.float32).peak_flops == 67e12
    assert roofline_for("989e12,3.35e12", CPU, torch.float32).ridge == pytest.approx(989 / 3.35)
    with pytest.raises(ls.InputError, match="positive"):
        roofline_for((0, 1), CPU, torch.float32)
    measured = ls.measure_roofline("cpu", repeats=1)
    assert measured.peak_flops > 0 and measured.peak_bandwidth > 0 and measured.source == "measured"


def test_report_roofline_columns_and_exports():
    m, x = Twice(), torch.randn(8, 16)
    rep = ls.profile(m, x, warmup=0, repeats=2, roofline=(100e9, 10e9))
    out = rep.layers[3]
    assert out.bound(rep.roofline) == "memory"
    assert out.roof_fraction(rep.roofline) == pytest.approx(2640 / out.forward.median / (2640 / 1512 * 10e9))
    text = rep.table()
    assert "% of roof" in text and "memory" in text and "ridge 10.0 FLOP/B" in text
    d = json.loads(rep.to_json())
    assert d["roofline"]["ridge"] == 10.0 and d["layers"][3]["bound"] == "memory"
    assert "roof_fraction" in rep.to_csv().splitlines()[0]


def _nested(events) -> bool:
    """Every pair of slices on one track is disjoint or nested."""
    by_tid: dict = {}
    for e in events:
        by_tid.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_tid.values():
        for a0, a1 in spans:
            for b0, b1 in spans:
                if a0 < b0 < a1 < b1:
                    return False
    return True


def test_chrome_trace_nests_each_track():
    m, x = small_cnn(), torch.randn(2, 3, 32, 32)
    rep = ls.profile(m, x, warmup=0, repeats=3, backward=True)
    d = json.loads(rep.to_chrome_trace())
    slices = [e for e in d["traceEvents"] if e["ph"] == "X"]
    # one slice per call and phase: 16 calls (root, stem 1+3, block 1+5, pool, head 1+3), forward
    # and backward
    assert len(rep.layers) == 16 and len(slices) == 32
    assert all(e["ts"] >= 0 and e["dur"] >= 0 for e in slices)
    assert _nested(slices)
    fwd_root = next(e for e in slices if e["cat"] == "forward" and e["name"] == "(root)")
    assert fwd_root["dur"] == pytest.approx(rep.layers[0].forward_span[1] * 1e6 - rep.layers[0].forward_span[0] * 1e6)
    # overlapping spans that do not nest go to another track
    placed = _lanes([(0.0, 10.0, "a"), (1.0, 3.0, "b"), (2.0, 5.0, "c"), (6.0, 7.0, "d")])
    assert {p[3]: p[0] for p in placed} == {"a": 0, "b": 0, "c": 1, "d": 0}
    assert chrome_trace(rep)["displayTimeUnit"] == "ms"


def _train(m, opt, x, steps):
    for _ in range(steps):
        loss = m(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


def test_training_profiler_steps_phases_and_reuse():
    torch.manual_seed(0)
    m, x = small_cnn(), torch.randn(4, 3, 32, 32)
    opt = torch.optim.AdamW(m.parameters())
    hooks = snapshot(m)["hooks"]
    prof = ls.Profiler(m, opt, warmup_steps=1)
    with prof:
        _train(m, opt, x, 4)
    assert snapshot(m)["hooks"] == hooks                     # every hook came off
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
    assert prof.steps == 4
    rep = prof.generate_report()
    t = rep.totals
    assert rep.options["steps"] == 3 and rep.options["warmup"] == 1 and t["runs"] == 3
    assert t["optimizer"] > 0 and t["backward"] > 0 and t["forward"] > 0
    # each step holds its forward, backward and optimizer step, so each median is at most the step's
    # (the sum of medians is not the median of sums: comparing with it failed on a busy machine)
    assert t["step"] >= max(t["forward"], t["backward"], t["optimizer"])
    assert [r.path for r in rep.layers][:3] == ["", "stem", "stem.0"] and len(rep.layers) == 16
    # costs from a meta analysis of the first step's inputs: Linear(16, 10) on 4 rows = 4*16*10 MACs
    # -> 1280 FLOPs + 40 bias adds
    assert rep.layers[-1].flops == 1320
    assert "Step" in rep.table() and "optimizer" in rep.table()
    # reuse: more steps neither add calls nor grow the per-step numbers' structure
    with prof:
        _train(m, opt, x, 2)
    again = prof.report()
    assert prof.steps == 6 and len(again.layers) == 16 and again.layers[-1].flops == 1320
    prof.end_profile()
    assert prof.steps == 0
    with pytest.raises(ls.InputError, match="no step"):
        prof.report()


def test_training_profiler_without_optimizer_and_manual_steps():
    m, x = Twice(), torch.randn(2, 16)
    prof = ls.Profiler(m)
    prof.start_profile()
    for _ in range(3):          # no optimizer, no step(): each top-level forward begins a step
        m(x).sum().backward()
    prof.stop_profile()
    assert prof.steps == 3
    prof.end_profile()
    prof = ls.Profiler(m, step_on="manual")
    prof.start_profile()
    for _ in range(2):          # gradient accumulation: two forwards per step, marked by step()
        m(x).sum().backward()
        m(x).sum().backward()
        prof.step()
    prof.stop_profile()
    rep = prof.report(warmup_steps=0)
    assert prof.steps == 2 and [(r.path, r.call_index) for r in rep.layers if r.depth == 0] == [("", 0), ("", 1)]
    with pytest.raises(ls.InputError, match="step_on"):
        ls.Profiler(m, step_on="optimizer")
    # a loop that raises inside a module: the hooks still come off, the step so far is kept
    hooks = snapshot(m)["hooks"]
    prof = ls.Profiler(m)
    with pytest.raises(RuntimeError):
        with prof:
            m(x).sum().backward()
            m(torch.randn(2, 3))          # wrong width: the Linear raises
    assert snapshot(m)["hooks"] == hooks and prof.steps == 2
    for p in m.parameters():
        p.grad = None


def test_cli_profile_json_roofline_and_trace(capsys, tmp_path):
    trace = tmp_path / "t.json"
    assert main(["profile", "layerscope.examples:small_cnn", "--repeats", "2", "--warmup", "0",
                 "--backward", "--roofline", "100e9,10e9", "--trace", str(trace), "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["kind"] == "latency" and d["layers"][0]["type"] == "SmallCNN"
    assert d["totals"]["forward_plain"] > 0 and d["roofline"]["ridge"] == 10.0
    assert any(e.get("cat") == "backward" for e in json.loads(trace.read_text())["traceEvents"])


def test_partition_by_latency_times_every_unit():
    # the units' times come from the profiler: each unit, the first included (its input needs no
    # gradient, its weight gradients are still its own), has a positive forward + backward time
    m, x = small_cnn(), torch.randn(4, 3, 32, 32)
    before = snapshot(m)
    plan = ls.partition(m, x, stages=2, by="latency", latency_repeats=2, measure_working=False)
    assert_unchanged(before, m)
    assert len(plan.units.units) >= 2
    assert all(u.latency is not None and u.latency > 0 for u in plan.units.units)


def test_chrome_trace_slice_ends_where_the_call_ended():
    # Regression (test_chrome_trace_nests_each_track failed 3 of 6 runs on main): ts + dur computed as
    # start * 1e6 + (end - start) * 1e6 lands past end * 1e6 for these two floats (found by a random
    # search), so a child ending with its parent stuck out of it by 1e-10 us.
    from layerscope.render.latency import _ts_dur
    start, end = 0.49543508709194095, 0.9449261518806791
    assert start * 1e6 + (end - start) * 1e6 > end * 1e6          # the float trap itself
    child, parent = _ts_dur(start, end), _ts_dur(0.1, end)
    assert child["ts"] + child["dur"] == parent["ts"] + parent["dur"]
    assert abs(child["ts"] + child["dur"] - end * 1e6) <= 2 ** -21  # on the grid: at most half a step off
