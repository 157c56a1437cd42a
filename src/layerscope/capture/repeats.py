"""The timing loop: warm-up and timed repeats of a model, each once without hooks (the reference)
and once with the Recorder's, until the medians are known well enough (``repeats="auto"``) or a
fixed count ran."""

from __future__ import annotations

import math
import statistics
from typing import Any, Callable

import torch
from torch import nn

from ..errors import InputError
from .timing import CallTimes, Clock, Recorder, merge_steps

__all__ = ["time_steps", "time_calls", "median_interval", "half_width", "precision", "warm_count", "AUTO_MIN", "AUTO_MAX",
           "TOL_TOTAL", "TOL_CALL", "CALL_SHARE", "WARMUP_MIN", "WARMUP_MAX"]


# Adaptive repeats (``repeats="auto"``) and warm-up (``warmup="auto"``).
#
# The figure a repeat adds to is the median of each time, so the rule asks how well the medians are
# known: the distribution-free 95% confidence interval of a median from order statistics — with n
# runs sorted, [x(k), x(n+1-k)] where k is the largest index with P(Binomial(n, 1/2) < k) <= 2.5% —
# must lie within +-TOL_TOTAL of the median for the whole forward (and backward) with hooks and
# without them, and within +-TOL_CALL for every call that takes at least CALL_SHARE of the whole
# (inclusive, forward or backward). No normality is assumed: the interval holds for any continuous
# distribution of run times, also the skewed one a shared machine gives.
#
# The constants. AUTO_MIN = 6 is the smallest n with a 95% interval at all ([x(1), x(6)] covers the
# median with 1 - 2/64 = 96.9%; with 5 runs the widest interval covers 93.75%). AUTO_MAX = 20 is the
# fixed count profile() used before, so "auto" never runs longer than it did. The tolerances are what
# those 20 repeats give on a typical spread: GPT-2 small (S=1024) on a 2-core CPU had the whole
# forward's IQR/median at 3.5-5% and its 15 calls over 5% at 2-10% (median 4%); at n = 20 the interval
# is [x(6), x(15)], about 0.9 IQR wide for a bell-shaped spread, i.e. +-0.44 x IQR/median: +-1.5-2.2%
# for the whole forward (TOL_TOTAL = 2%) and up to +-4.4% for the noisiest large call (TOL_CALL = 5%).
# A quieter run reaches the same precision sooner and stops (at 6 on a noiseless one); a noisier one
# runs to the maximum, as before. Stopping on the data makes the interval's coverage slightly
# optimistic (optional stopping), which is why the minimum stays at 6 rather than lower.
AUTO_MIN, AUTO_MAX = 6, 20
TOL_TOTAL, TOL_CALL, CALL_SHARE = 0.02, 0.05, 0.05
# Warm-up "auto": at least 1 run (first runs pay for allocations, oneDNN primitive creation and
# cold caches), then a run is warm-up while it was slower than the next one by more than TOL_TOTAL (a
# smaller difference is within the precision the medians are asked for), at most WARMUP_MAX = 3
# (the fixed count used before).
WARMUP_MIN, WARMUP_MAX = 1, 3


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float] | None:
    """The distribution-free ``confidence`` interval of the median of ``values`` from order
    statistics: (x(k), x(n+1-k)) of the sorted values, k the largest index with
    P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2. None when n is too small for one."""
    n = len(values)
    alpha, cum, k = (1 - confidence) / 2, 0.0, 0
    for i in range(n + 1):
        cum += math.comb(n, i) / 2 ** n      # P(B <= i)
        if cum > alpha:
            break
        k = i + 1
    if k == 0:
        return None
    s = sorted(values)
    return s[k - 1], s[n - k]


def half_width(values: list[float]) -> float:
    """Half the width of the median's 95% interval over the median (inf: too few values for one)."""
    ci = median_interval(values)
    med = statistics.median(values) if values else 0.0
    if ci is None or med <= 0:
        return float("inf") if ci is None else 0.0
    return (ci[1] - ci[0]) / (2 * med)


def precision(steps: list[list[CallTimes]], plain: dict[str, list[float]], hooked: dict[str, list[float]],
              phases: tuple[str, ...]) -> tuple[float, str]:
    """How far the medians are from the stopping rule: the largest ratio of a half-width to its
    tolerance (<= 1: precise enough) and what it is (for the report)."""
    worst, what = 0.0, ""

    def see(values: list[float], tol: float, name: str) -> None:
        nonlocal worst, what
        r = half_width(values) / tol
        if r > worst:
            worst, what = r, name

    for phase in phases:
        see(hooked[phase], TOL_TOTAL, f"the {phase} with hooks")
        see(plain[phase], TOL_TOTAL, f"the {phase} without hooks")
        if not steps:
            continue
        n = len(steps)
        per_call = [[steps[r][i].forward[0] if phase == "forward" else steps[r][i].backward[0] for r in range(n)]
                    for i in range(len(steps[0]))]
        roots = [i for i, c in enumerate(steps[0]) if c.parent is None]
        whole = statistics.median([sum(per_call[i][r] for i in roots) for r in range(n)])
        for i, vals in enumerate(per_call):
            if whole > 0 and statistics.median(vals) >= CALL_SHARE * whole:
                see(vals, TOL_CALL, f"{steps[0][i].path or '(root)'} {phase}")
    return worst, what


def warm_count(totals: list[float], least: int = WARMUP_MIN, most: int = WARMUP_MAX) -> int | None:
    """How many of the first runs (seconds per run: ``totals``) are warm-up: ``least``, then each
    next one while it was slower than its successor by more than TOL_TOTAL, at most ``most``. None:
    not known yet (the run after the last candidate has not run)."""
    w = least
    while w < most:
        if len(totals) < w + 2:
            return None
        if totals[w] <= totals[w + 1] * (1 + TOL_TOTAL):
            break
        w += 1
    return w



def time_steps(model: nn.Module, run: Callable[[], Any], loss_of: Callable[[Any], torch.Tensor] | None, *,
               device: torch.device, warmup: int | str, repeats: int | str,
               progress: Callable[[], None] | None = None, info: dict | None = None):
    """Time every module call. ``run()`` is one forward; ``loss_of(output)`` the loss whose backward
    is timed (None: forward only). Each repeat runs once without hooks (the reference) and once
    with them, in alternating order, so drift and order effects hit both alike. Returns (calls, plain, hooked): the calls in pre-order with
    their seconds per timed repeat, and the forward and backward seconds of each run without and
    with hooks: ``{"forward": [...], "backward": [...]}``.

    ``repeats="auto"``: at least AUTO_MIN and at most AUTO_MAX repeats, stopping at the first at
    which every median that matters is known within its tolerance (see ``precision``);
    ``warmup="auto"``: see ``warm_count``. ``info`` (a dict) receives what ran: ``warmup``,
    ``repeats``, ``stopped`` ("fixed", "precise" or "maximum") and, for "auto", ``worst`` (the
    least precise median: its half-width over its tolerance, and its name)."""
    clock = Clock(device)
    rec = Recorder(model, device, backward=loss_of is not None, defer=True, this_thread_only=True)
    phases = ("forward", "backward") if loss_of is not None else ("forward",)

    def once():
        clock.sync()
        t0 = clock.stamp()
        out = run()
        t1 = clock.stamp()
        rec.hook_pending()            # untimed: between the forward and the backward
        t1b = clock.stamp()
        if loss_of is not None:
            loss_of(out).backward()
        del out
        t2 = clock.stamp()
        clock.sync()
        return clock.seconds(t0, t1), clock.seconds(t1b, t2)

    runs: list[tuple] = []            # per repeat, warm-up included: (step, f, b, hf, hb)
    first: list | None = None
    warm = warmup if isinstance(warmup, int) else None
    stopped, worst = "fixed", (0.0, "")

    def timed(w: int):
        rs = runs[w:]
        plain = {"forward": [x[1] for x in rs], "backward": [x[2] for x in rs] if loss_of is not None else []}
        hooked = {"forward": [x[3] for x in rs], "backward": [x[4] for x in rs] if loss_of is not None else []}
        return [x[0] for x in rs], plain, hooked

    try:
        r = 0
        while True:
            if r % 2 == 0:
                f, b = once()                 # the reference: no hooks
            rec.attach()
            rec.begin()
            try:
                hf, hb = once()
            finally:
                rec.detach()
            step = rec.end()[0]
            if r % 2 == 1:                    # every other repeat runs the reference second
                f, b = once()
            keys = [c.key for c in step]
            if first is None:
                first = keys
            elif keys != first:
                raise InputError(f"{_first_difference(keys, first)}: per-call times need the same module "
                                 "calls in every run (data-dependent control flow?)")
            runs.append((step, f, b, hf, hb))
            r += 1
            if progress is not None:
                progress()
            if warm is None:
                warm = warm_count([x[1] + x[2] + x[3] + x[4] for x in runs])
                if warm is None:
                    continue
            n = len(runs) - warm
            if isinstance(repeats, int):
                if n >= repeats:
                    break
                continue
            if n < AUTO_MIN:
                continue
            steps, plain, hooked = timed(warm)
            worst = precision(steps, plain, hooked, phases)
            if worst[0] <= 1.0:
                stopped = "precise"
                break
            if n >= AUTO_MAX:
                stopped = "maximum"
                break
    finally:
        rec.detach()
    steps, plain, hooked = timed(warm)
    if info is not None:
        # ``pass_seconds``: every timed pass, warm-up included, with and without hooks (what the loop
        # cannot do without: bench/bench_profile_overhead.py sets profile()'s time against it)
        info.update(warmup=warm, repeats=len(steps), stopped=stopped,
                    pass_seconds=sum(x[1] + x[2] + x[3] + x[4] for x in runs))
        if stopped != "fixed":
            info["worst"] = worst
    return steps, plain, hooked


def time_calls(model: nn.Module, run: Callable[[], Any], loss_of: Callable[[Any], torch.Tensor] | None, *,
               device: torch.device, warmup: int | str, repeats: int | str,
               progress: Callable[[], None] | None = None, info: dict | None = None):
    """``time_steps`` (see there), its steps merged into one list of calls (pre-order,
    one entry per timed repeat): (calls, plain, hooked)."""
    steps, plain, hooked = time_steps(model, run, loss_of, device=device, warmup=warmup, repeats=repeats,
                                      progress=progress, info=info)
    return merge_steps(steps), plain, hooked


def _first_difference(keys: list, first: list) -> str:
    """Where one timed run's module calls (path, call index) part from the first run's, in words (the
    same count with other calls said "16 calls in one run and 16 in the first", issue 58)."""
    def name(k) -> str:
        return f"'{k[0] or '(root)'}'" + (f" (call {k[1] + 1})" if k[1] else "")
    for i, (a, b) in enumerate(zip(keys, first)):
        if a != b:
            return f"module call {i + 1} of a timed run was {name(a)} where the first run's was {name(b)}"
    return f"the model made {len(keys)} module calls in one run and {len(first)} in the first"
