"""Issue 34 item 7: a profile row whose median is less precise than the stopping rule's tolerance is
marked in the table (" ~"), with a footer line saying what the mark means."""

import layerscope as ls
from layerscope.analyses.latency import LatencyLayer, Timing, timing


def test_half_width_by_hand():
    # n = 10: P(Binomial(10, 1/2) <= 1) = 11/1024 = 1.07% <= 2.5% < P(<= 2) = 56/1024 = 5.5%, so k = 2
    # and the median's interval is [x(2), x(9)]; for 1..10: [2, 9] around the median 5.5:
    # half-width (9 - 2) / (2 * 5.5) = 0.6364
    assert round(timing([float(v) for v in range(1, 11)]).half_width, 4) == 0.6364
    # five values have no 95% interval (the widest, [x(1), x(5)], covers 93.75%): None, not inf (JSON)
    assert timing([1.0, 2.0, 3.0, 4.0, 5.0]).half_width is None


def _t(median, hw):
    return Timing(median=median, p25=median, p75=median, min=median, max=median, half_width=hw)


def _report(runs):
    # root 10 ms: a 6 ms child known to +-8% (over 5% of the run, beyond +-5%: marked), a 0.3 ms child
    # at +-8% (3% of the run: the rule does not ask it to be precise), a 3.7 ms child at +-3% (within)
    rows = [("", 0, None, (1, 2, 3), _t(10e-3, 0.01)), ("a", 1, 0, (), _t(6e-3, 0.08)),
            ("b", 1, 0, (), _t(0.3e-3, 0.08)), ("c", 1, 0, (), _t(3.7e-3, 0.03))]
    layers = tuple(LatencyLayer(index=i, path=p, type="M", depth=d, call_index=0, parent=par, children=ch, params=0,
                                input_shapes=(), output_shapes=(), forward=t, forward_self=t, backward=None,
                                backward_self=None, flops=0, bytes_moved=0)
                   for i, (p, d, par, ch, t) in enumerate(rows))
    totals = {"runs": runs, "forward_instrumented": 10e-3, "forward_self_sum": 10e-3, "forward_spread": 0.05}
    return ls.LatencyReport(model_name="Net", device="cpu", options={"warmup": 1, "repeats": runs,
                                                                     "backward": False, "unit": "repeat"},
                            layers=layers, totals=totals)


def test_imprecise_rows_are_marked():
    text = _report(20).table(columns="forward")
    marked = [ln for ln in text.splitlines() if ln.rstrip().endswith("~")]
    assert len(marked) == 1 and "a: M" in marked[0], text
    assert "~ 1 call over 5% of the run whose median's 95% interval is wider than +-5% (more repeats would " \
           "narrow it)" in " ".join(text.split()), text
    # with fewer than 6 repeats the footer says there is no interval at all
    assert "1 call over 5% of the run: 5 repeats give no 95% interval of a median (6 do)" in \
        " ".join(_report(5).table(columns="forward").split())
