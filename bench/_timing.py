"""Paired timing for the benchmarks: ratios that hold on a noisy, shared machine.

Timing the baseline three times and then the tool three times lets load that comes and goes land on
one side only: under load bench/speed.py once printed FlopCounterMode at 0.54x and DeepSpeed at
0.81x a plain forward, which is impossible (both run that forward). Here the baseline A and the
subject B alternate, A B, B A, A B, ... (the order flips every pair, so a steady drift such as a
warming cache or a load that ramps up favours neither side), each pair gives one ratio B / A, and
the result is the median of those ratios with their min and max.

A result is flagged untrustworthy when the ratios disagree too much to support two significant
digits: max / min over MAX_SPREAD (1.5), or the interquartile range over IQR_LIMIT (0.2) of the
median. Both limits are judgement, not statistics: a quiet 2-core machine gives max / min of about
1.05-1.2 on these benchmarks, and a ratio the run cannot pin within +-10% is not worth printing as
a figure. The flag is a warning for a person reading the output; nothing asserts on it.

Pure Python (no torch), so that `python bench/_timing.py --selftest` checks it in a fraction of
a second (tests/test_bench_timing.py runs that; tests do not import bench/).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

MAX_SPREAD = 1.5    # max / min of the per-pair ratios above this: untrustworthy
IQR_LIMIT = 0.2     # (q3 - q1) / median of the per-pair ratios above this: untrustworthy


@dataclass
class Paired:
    """Per-pair ratios B / A and their summary; ``a`` and ``b`` are the raw seconds, pair by pair."""
    ratios: list[float]
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)
    unit: str = "pairs"     # what one ratio is, for describe(): "pairs", or e.g. "runs" from summarize()

    @property
    def median(self) -> float:
        return statistics.median(self.ratios)

    @property
    def min(self) -> float:
        return min(self.ratios)

    @property
    def max(self) -> float:
        return max(self.ratios)

    @property
    def spread(self) -> float:
        """max / min of the ratios (1.0 when they all agree)."""
        return self.max / self.min if self.min > 0 else float("inf")

    @property
    def iqr(self) -> float:
        """Interquartile range of the ratios over their median (0 with fewer than 4 pairs: no quartiles)."""
        if len(self.ratios) < 4:
            return 0.0
        q1, _, q3 = statistics.quantiles(self.ratios, n=4, method="inclusive")
        return (q3 - q1) / self.median if self.median > 0 else float("inf")

    @property
    def trustworthy(self) -> bool:
        return self.spread <= MAX_SPREAD and self.iqr <= IQR_LIMIT

    @property
    def a_median(self) -> float:
        return statistics.median(self.a) if self.a else float("nan")

    @property
    def b_median(self) -> float:
        return statistics.median(self.b) if self.b else float("nan")

    def describe(self) -> str:
        """'2.31x [2.20-2.45, 5 pairs]', with ' UNTRUSTED (...)' appended when the spread is too wide."""
        s = f"{self.median:.2f}x [{self.min:.2f}-{self.max:.2f}, {len(self.ratios)} {self.unit}]"
        why = ([f"max/min {self.spread:.2f} > {MAX_SPREAD}"] if self.spread > MAX_SPREAD else []) + \
            ([f"IQR {self.iqr:.0%} of the median > {IQR_LIMIT:.0%}"] if self.iqr > IQR_LIMIT else [])
        return s + (f" UNTRUSTED ({', '.join(why)})" if why else "")

    def as_row(self, prefix: str = "ratio") -> dict:
        """Flat fields for a CSV / JSON row."""
        return {prefix: self.median, f"{prefix}_min": self.min, f"{prefix}_max": self.max,
                f"{prefix}_pairs": len(self.ratios), f"{prefix}_trustworthy": self.trustworthy}


def summarize(ratios: list[float], unit: str = "runs") -> Paired:
    """The same summary and flag for ratios measured elsewhere (e.g. one per profiler run)."""
    if not ratios:
        raise ValueError("no ratios to summarize")
    return Paired(list(ratios), unit=unit)


def paired_ratios(a: Callable[[], object], b: Callable[[], object], pairs: int = 5, warmup: int = 1,
                  clock: Callable[[], float] = time.perf_counter) -> Paired:
    """Time ``a`` (the baseline) and ``b`` alternately, ``pairs`` times each, after ``warmup`` untimed
    calls of each; return the per-pair ratios time(b) / time(a). Pair k runs A first when k is even,
    B first when k is odd. ``clock`` is injectable for the self-test."""
    if pairs < 1:
        raise ValueError("pairs must be at least 1")
    for _ in range(warmup):
        a()
        b()

    def timed(fn) -> float:
        t = clock()
        fn()
        return clock() - t

    ta, tb = [], []
    for k in range(pairs):
        if k % 2 == 0:
            ta.append(timed(a))
            tb.append(timed(b))
        else:
            tb.append(timed(b))
            ta.append(timed(a))
    return Paired([y / x if x > 0 else float("inf") for x, y in zip(ta, tb)], ta, tb)


def no_grad(fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run under ``torch.no_grad()``: the plain forward each tool is compared with. torch is
    imported late, so that this module stays importable without it."""
    import torch

    def run():
        with torch.no_grad():
            fn()
    return run


def _selftest() -> None:
    now = [0.0]
    calls: list[str] = []

    def clock():
        return now[0]

    def step(name, costs):
        it = iter(costs)

        def fn():
            calls.append(name)
            now[0] += next(it)
        return fn

    # steady: A costs 1 s, B 2 s: every ratio exactly 2, order A B, B A, A B after one warm-up pair
    r = paired_ratios(step("a", [9] + [1] * 3), step("b", [9] + [2] * 3), pairs=3, warmup=1, clock=clock)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"], calls
    assert r.ratios == [2.0, 2.0, 2.0] and r.median == 2.0 and r.spread == 1.0 and r.trustworthy, r
    assert r.a == [1, 1, 1] and r.b == [2, 2, 2]
    assert r.describe() == "2.00x [2.00-2.00, 3 pairs]", r.describe()

    # a load burst on one pair: B's time there is 4x; the median holds, the flag goes up (max/min 4)
    calls.clear()
    r = paired_ratios(step("a", [1] * 5), step("b", [2, 2, 8, 2, 2]), pairs=5, warmup=0, clock=clock)
    assert r.ratios == [2.0, 2.0, 8.0, 2.0, 2.0] and r.median == 2.0 and r.max == 8.0
    assert r.spread == 4.0 and not r.trustworthy
    assert r.describe() == "2.00x [2.00-8.00, 5 pairs] UNTRUSTED (max/min 4.00 > 1.5)", r.describe()

    # a linear drift (each call 10% slower than the last) cancels in the median because the order flips
    calls.clear()
    t = [1.0 * 1.1 ** i for i in range(12)]
    ra = [t[0], t[3], t[4], t[7], t[8], t[11]]   # A's slots: A B | B A | A B | B A | A B | B A
    rb = [t[1], t[2], t[5], t[6], t[9], t[10]]
    r = paired_ratios(step("a", ra), step("b", rb), pairs=6, warmup=0, clock=clock)
    # ratios alternate 1.1 and 1/1.1; their median (1.1 + 0.909) / 2 = 1.0045 is within 1% of the truth,
    # where A-always-first would give 1.1 in every pair (a 10% bias, with no spread to flag it)
    assert r.ratios[0] > 1.09 and r.ratios[1] < 0.91 and abs(r.median - 1.0) < 0.01, r.ratios
    assert r.trustworthy                               # max/min 1.21, within 1.5

    # the IQR limit alone (both sets have max/min 1.45 <= 1.5): 1.0 1.0 1.3 1.3 1.3 1.3 1.45 1.45 has
    # q1 1.225, q3 1.3375 (inclusive method), IQR/median 0.1125/1.3 = 8.7%: trusted; 1.0 1.0 1.0 1.45
    # 1.45 1.45 (two camps) has q1 1.0, q3 1.45, IQR/median 0.45/1.225 = 37%: untrusted
    assert summarize([1.0, 1.0, 1.3, 1.3, 1.3, 1.3, 1.45, 1.45]).trustworthy
    s = summarize([1.0, 1.0, 1.0, 1.45, 1.45, 1.45])
    assert s.spread <= MAX_SPREAD and s.iqr > IQR_LIMIT and not s.trustworthy
    row = s.as_row("fwd")
    assert s.describe().startswith("1.23x [1.00-1.45, 6 runs] UNTRUSTED (IQR 37%"), s.describe()
    assert row["fwd"] == 1.225 and row["fwd_min"] == 1.0 and row["fwd_pairs"] == 6 and not row["fwd_trustworthy"]
    for bad in (lambda: summarize([]), lambda: paired_ratios(lambda: 0, lambda: 0, pairs=0)):
        try:
            bad()
        except ValueError:
            pass
        else:
            raise AssertionError("expected ValueError")
    print("selftest ok")


if __name__ == "__main__":
    if sys.argv[1:] == ["--selftest"]:
        _selftest()
    else:
        sys.exit("usage: python bench/_timing.py --selftest  (the helper itself is imported by the bench scripts)")
