"""profile(repeats="auto", warmup="auto"): the stopping rule on a fake clock (no wall-clock
assertions), the count and the reason in the report, and the CLI's --repeats/--warmup auto|int."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import nn

import layerscope as ls
import layerscope.capture.repeats as L
from layerscope.cli import main

CPU = torch.device("cpu")


class FakeClock:
    """The profiler's clock: time moves only when the model runs (``durations`` in turn, the last one
    repeated; with ``cycle`` over and over)."""

    def __init__(self, durations, cycle: bool = False) -> None:
        self.now, self.durations, self.i, self.cycle = 0.0, list(durations), 0, cycle

    def run(self) -> None:
        n = len(self.durations)
        self.now += self.durations[self.i % n if self.cycle else min(self.i, n - 1)]
        self.i += 1


class Ticks(nn.Module):
    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.clock = clock

    def forward(self, x):
        if x.device.type != "meta" and not isinstance(x, torch._subclasses.FakeTensor):
            self.clock.run()
        return self.fc(x)


@pytest.fixture
def fake(monkeypatch):
    def make(durations, cycle=False):
        clock = FakeClock(durations, cycle)
        monkeypatch.setattr(L.Clock, "stamp", lambda self: clock.now)
        return clock
    return make


def _time(model, **kw):
    x = torch.randn(2, 4)
    info: dict = {}
    with torch.no_grad():
        out = L.time_calls(model, lambda: model(x), None, device=CPU, info=info, **kw)
    return out, info


def test_median_interval_order_statistics():
    # n = 6: P(B(6, 1/2) = 0) = 1/64 <= 2.5%, P(B <= 1) = 7/64 > 2.5%: k = 1, [x(1), x(6)]
    assert L.median_interval([6, 1, 5, 2, 4, 3]) == (1, 6)
    # n = 5: even [x(1), x(5)] covers only 1 - 2/32 = 93.75%: no 95% interval
    assert L.median_interval([1, 2, 3, 4, 5]) is None
    # n = 20: P(B <= 5) = 0.0207 <= 2.5% < P(B <= 6) = 0.0577: k = 6, [x(6), x(15)]
    assert L.median_interval(list(range(1, 21))) == (6, 15)
    # half width over the median: (15 - 6) / 2 / 10.5
    assert L.half_width(list(range(1, 21))) == pytest.approx(4.5 / 10.5)
    assert math.isinf(L.half_width([1.0, 2.0]))


def test_warm_count():
    assert L.warm_count([9.0, 1.0]) is None                 # run 1 cannot be judged before run 2
    assert L.warm_count([9.0, 1.0, 1.0]) == 1                # not slower than the next: warm
    assert L.warm_count([9.0, 1.01, 1.0]) == 1               # 1% slower: within the 2% tolerance
    assert L.warm_count([9.0, 2.0, 1.0, 1.0]) == 2           # twice the next: still warming up
    assert L.warm_count([9.0, 4.0, 3.0, 2.0, 1.0]) == 3      # at most 3
    assert L.warm_count([9.0, 1.0], least=1, most=1) == 1


def test_noiseless_stops_at_the_minimum(fake):
    clock = fake([5.0, 1.0])              # a slow first run, then every run alike
    (calls, plain, hooked), info = _time(Ticks(clock), warmup="auto", repeats="auto")
    assert info["stopped"] == "precise" and info["repeats"] == L.AUTO_MIN == 6 and info["warmup"] == 1
    assert len(hooked["forward"]) == len(plain["forward"]) == len(calls[0].forward) == 6
    assert hooked["forward"] == [1.0] * 6 and info["worst"][0] == 0.0


def test_noisy_runs_to_the_maximum(fake):
    # runs take 1.0, 1.3 and 1.6 s in turn (plain and hooked alike): the median's interval spans
    # 1.0-1.6 s, +-23% of 1.3 s, never within +-2%
    clock = fake([1.0, 1.3, 1.6], cycle=True)
    (calls, plain, hooked), info = _time(Ticks(clock), warmup=1, repeats="auto")
    assert info["stopped"] == "maximum" and info["repeats"] == L.AUTO_MAX == 20
    assert info["warmup"] == 1 and len(hooked["forward"]) == 20
    assert info["worst"][0] > 1 and "forward" in info["worst"][1]


def test_a_fixed_count_is_kept(fake):
    clock = fake([1.0])
    (_, _, hooked), info = _time(Ticks(clock), warmup=2, repeats=3)
    # pass_seconds: 5 runs (2 warm-up + 3), each a forward without hooks and one with, 1 s each
    assert info == {"warmup": 2, "repeats": 3, "stopped": "fixed", "pass_seconds": 10.0} and \
        len(hooked["forward"]) == 3
    assert clock.i == 2 * (2 + 3)         # plain and hooked run per repeat, warm-up included


def test_profile_reports_the_count_and_why(fake):
    clock = fake([1.0])
    m = Ticks(clock)
    rep = ls.profile(m, torch.randn(2, 4))
    o = rep.options
    assert (o["repeats"], o["warmup"], o["stopped"], o["repeats_rule"]) == (6, 1, "precise", "auto")
    assert rep.totals["runs"] == 6
    text = rep.table()
    assert "Repeats" in text and "precise enough after 6" in text
    fixed = ls.profile(m, torch.randn(2, 4), warmup=0, repeats=2)
    assert fixed.options == {"warmup": 0, "repeats": 2, "backward": False, "unit": "repeat"}
    assert "Repeats" not in fixed.table()
    with pytest.raises(ls.InputError, match="repeats"):
        ls.profile(m, torch.randn(2, 4), repeats="often")


def test_cli_repeats_auto_and_int(capsys):
    spec = "layerscope.examples:small_cnn"
    assert main(["profile", spec, "--repeats", "2", "--warmup", "0", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"]["options"]["repeats"] == 2 and "stopped" not in d["model"]["options"]
    assert main(["profile", spec, "--repeats", "auto", "--warmup", "1", "--format", "json"]) == 0
    d = json.loads(capsys.readouterr().out)
    o = d["model"]["options"]
    assert o["repeats_rule"] == "auto" and o["warmup"] == 1 and o["stopped"] in ("precise", "maximum")
    assert L.AUTO_MIN <= o["repeats"] <= L.AUTO_MAX and d["totals"]["runs"] == o["repeats"]
    assert main(["profile", spec, "--repeats", "sometimes"]) == 1
    assert "an integer or auto" in capsys.readouterr().err


def test_report_repeats_flag_parses_auto_and_int():
    from layerscope.cli import build_parser
    base = ["report", "layerscope.examples:small_cnn", "-o", "r.html", "--profile"]
    assert build_parser().parse_args(base).repeats == 10          # report keeps its fixed 10 by default
    assert build_parser().parse_args(base + ["--repeats", "auto"]).repeats == "auto"
    assert build_parser().parse_args(base + ["--repeats", "7"]).repeats == 7
