"""Issue 58, item 5: a profile shows how far its times can be trusted. On a busy machine
`profile tiny_gpt --backward --roofline measure` printed "1.41 ms uninstrumented, 43.16 ms with
hooks", a spread of 2,317% and a "% of roof" of 122.6% without a word. Now a time whose spread
(IQR/median of its repeats) is over SPREAD_LIMIT (25%) is marked "!" in the table, the whole run's
spread over it puts "UNRELIABLE TIMES" in the table's first line, and a % of roof over 100% is marked
"?" with an "Over roof" line saying why; the JSON's notes carry the same sentences. The reports are
built from fabricated timing samples (the analyses are pure functions of them): nothing is timed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

import layerscope as ls
import layerscope.analyses.latency as latency
from layerscope.analyses.latency import latency_layers, latency_totals
from layerscope.analyses.roofline import Roofline
from layerscope.capture.timing import CallTimes

MS = 1e-3
# fc: 1,960,000 FLOPs over 980,000 bytes (2 FLOP/B); under a 1 GFLOP/s, 1 GB/s roof it may reach
# min(1e9, 2 x 1e9) = 1e9 FLOP/s, and 1.96e6 FLOPs in 1.6 ms is 1.225e9 FLOP/s: 122.5% of the roof
ROOF = Roofline("given", 1e9, 1e9, "given")


def _costs(flops: int, nbytes: int):
    rec = lambda path: SimpleNamespace(  # noqa: E731
        path=path, call_index=0, subtree_params=0, inputs=(), outputs=(),
        forward_total=SimpleNamespace(flops=flops, bytes_moved=nbytes),
        backward_total=SimpleNamespace(flops=0, bytes_moved=0))
    return SimpleNamespace(layers=[rec(""), rec("fc")])


def _report(root_ms, fc_ms, plain_ms) -> ls.LatencyReport:
    root = CallTimes("", "Net", 0, 0, None, [1], forward=[t * MS for t in root_ms],
                     forward_span=[None] * len(root_ms))
    fc = CallTimes("fc", "Linear", 1, 0, 0, [], forward=[t * MS for t in fc_ms], forward_span=[None] * len(fc_ms))
    calls = [root, fc]
    totals = latency_totals(calls, {"forward": root.forward}, {"forward": [t * MS for t in plain_ms]}, False)
    return ls.LatencyReport(model_name="Net", device="cpu", options={"warmup": 1, "repeats": len(root_ms),
                                                                      "backward": False, "unit": "repeat"},
                            layers=tuple(latency_layers(calls, _costs(1_960_000, 980_000), False)),
                            totals=totals, roofline=ROOF)


# the busy machine: quartiles (inclusive) of the uninstrumented runs 1.0 and 30.0 ms over a median of
# 1.41 ms: (30.0 - 1.0) / 1.41 = 20.567 -> 2,056.7%; the root with hooks: quartiles 1.6 and 60.0 over
# 43.08 ms -> 135.6%; fc steady at 1.6 ms (quartiles 1.6 and 1.6: spread 0)
BUSY = dict(root_ms=[1.5, 1.6, 43.08, 60.0, 80.0], fc_ms=[1.55, 1.6, 1.6, 1.6, 1.65],
            plain_ms=[0.5, 1.0, 1.41, 30.0, 40.0])


def test_spread_and_over_roof_are_flagged():
    rep = _report(**BUSY)
    assert rep.totals["forward_spread"] == pytest.approx(20.567, abs=1e-3)
    root, fc = rep.layers
    assert root.forward.spread == pytest.approx(1.3556, abs=1e-4) and fc.forward.spread == 0
    assert fc.roof_fraction(ROOF) == pytest.approx(1.225)
    text = rep.table()
    lines = text.splitlines()
    assert lines[0] == "layerscope profile: Net -- UNRELIABLE TIMES: forward spread 2,056.7% (over 25%)"
    row = {ln.split()[0].lstrip("└─"): ln for ln in lines if ln.startswith(("Net ", "└─fc"))}
    # the root's time: spread 135.6% ("~" too: 5 repeats give no 95% interval of a median)
    assert "43.08 ms ~!" in row["Net"]
    assert "1.60 ms   1.60 ms" in row["fc:"] and "!" not in row["fc:"]
    assert "122.50% ?" in row["fc:"]
    assert "spread (IQR/median) 2,056.7% ! over 25%" in text
    assert "Unreliable   spread (IQR/median over the repeats) the forward's 2,056.7%, over the 25% limit" in text
    assert "!            1 call whose time spreads over 25% of its median" in text
    over = next(ln for ln in lines if ln.startswith("Over roof"))
    assert "1 call above 100% of the roof (fc 122.5%)" in over and "the peaks are (given: 1.00 GFLOP/s" in over
    notes = json.loads(json.dumps(rep.to_dict()))["notes"]
    assert [n.split(":")[0] for n in notes] == ["Unreliable", "!", "Over roof"]
    assert latency.SPREAD_LIMIT == 0.25


def test_a_steady_run_is_not_flagged():
    # every spread 0-12.5% (fc: quartiles 1.6 and 1.8 over 1.6 ms), and fc at 1.96e6 FLOPs / 2.0 ms =
    # 0.98e9 FLOP/s: 98% of the roof
    rep = _report(root_ms=[2.1, 2.1, 2.1, 2.2, 2.2], fc_ms=[2.0, 2.0, 2.0, 2.1, 2.1],
                  plain_ms=[2.0, 2.0, 2.0, 2.0, 2.1])
    text = rep.table()
    assert text.splitlines()[0] == "layerscope profile: Net"
    assert "!" not in text and "?" not in text and "UNRELIABLE" not in text and "Over roof" not in text
    assert rep.to_dict()["notes"] == []
