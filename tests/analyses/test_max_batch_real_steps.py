"""Issue 34, item 4: max_batch_size's real (measured) steps search below a predicted answer that does
not fit by bisection guided by the measurements, not one batch at a time: at most
ceil(log2(answer)) + 2 real steps (``BatchFit.real_steps``), and the same answer a step down one at a
time finds. The steps are counted by replacing the function that runs them (``memory_with``): the
simulated peaks follow a line set by hand and the "measured" peaks a curve set by hand, so every
answer below is derived by hand and checked against a linear search as well."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import layerscope as ls
import layerscope.api._batch as batch_mod
from layerscope.api._batch import real_step_bound

BASE, PER = 1_000, 100                 # simulated peak at batch k: BASE + PER * k
LIMIT = BASE + PER * 2_000             # so the simulation's answer is 2,000 (2,001 is 100 bytes over)


def _run(monkeypatch, real):
    """max_batch_size with simulated peaks BASE + PER * k and measured peaks real(k)."""
    steps = []

    def fake(model, args, kwargs, opts):
        k = opts.batch_size
        if opts.measure:
            steps.append(k)
        return SimpleNamespace(peak_bytes=BASE + PER * k,
                               measured=SimpleNamespace(peak_bytes=real(k)) if opts.measure else None)

    monkeypatch.setattr(batch_mod, "memory_with", fake)
    fit = ls.max_batch_size(nn.Linear(8, 4), torch.randn(1, 8), limit=LIMIT)
    return fit, steps


def _linear(real, start: int) -> int:
    """The old search: down one batch at a time from the predicted answer."""
    b = start
    while b >= 1 and real(b) > LIMIT:
        b -= 1
    return b


CURVES = {
    # 30 bytes of scratch per sample: (LIMIT - BASE) // 130 = 200,000 // 130 = 1,538 (1,539 * 130 = 200,070)
    "scratch per sample": (lambda k: BASE + 130 * k, 1_538),
    # a fixed 50,000-byte workspace: (200,000 - 50,000) // 100 = 1,500
    "fixed workspace": (lambda k: BASE + 50_000 + PER * k, 1_500),
    # a quadratic term: 100k + k^2/40 <= 200,000 -> k^2 + 4,000k - 8,000,000 <= 0 ->
    # k <= -2,000 + sqrt(4,000,000 + 8,000,000) = 1,464.1 -> 1,464
    "quadratic": (lambda k: BASE + PER * k + k * k // 40, 1_464),
    # the measured step fits at the predicted answer (5% under the simulation): 2,000, one real step
    "fits as predicted": (lambda k: BASE + 95 * k, 2_000),
    # a 64-byte step every 100 batches on top of 101 per sample: 101k + 64*(k // 100) <= 200,000;
    # k = 1,970: 198,970 + 1,216 = 200,186 > 200,000; k = 1,968: 198,768 + 1,216 = 199,984 fits;
    # 1,969: 198,869 + 1,216 = 200,085 > 200,000 -> 1,968
    "staircase": (lambda k: BASE + 101 * k + 64 * (k // 100), 1_968),
    # nothing fits for real: batch 1 measures 300,000 bytes -> 0
    "nothing fits": (lambda k: 300_000 + k, 0),
}


@pytest.mark.parametrize("name", sorted(CURVES))
def test_real_steps_bisect_within_the_bound(monkeypatch, name):
    real, expected = CURVES[name]
    fit, steps = _run(monkeypatch, real)
    assert _linear(real, 2_000) == expected          # the hand derivation, by the old search
    assert fit.batch_size == expected
    # bound: ceil(log2(2,000)) + 2 = 11 + 2 = 13 real steps (the old search: up to 2,000)
    assert real_step_bound(2_000) == 13
    assert len(steps) == fit.real_steps <= 13
    assert len(set(steps)) == len(steps)             # no batch measured twice
    assert steps[0] == 2_000                         # the first real step is at the predicted answer
    if 0 < expected < 2_000:
        assert expected in steps and expected + 1 in steps   # the answer and the one above, measured
        assert dict(fit.measured)[expected] <= LIMIT < dict(fit.measured)[expected + 1]


def test_fits_as_predicted_takes_one_real_step(monkeypatch):
    fit, steps = _run(monkeypatch, CURVES["fits as predicted"][0])
    assert steps == [2_000] and fit.real_steps == 1


@pytest.mark.parametrize("answer", [1, 2, 3, 4, 5, 7, 8, 9, 100, 1_000, 1_025])
@pytest.mark.parametrize("true", [0, 1, 2, "half", "answer-1"])
def test_bound_holds_for_every_bracket(answer, true):
    # the search alone, on a step function: batches up to `true` fit, the rest do not; no prediction
    # can be made (no simulated reports), so it is pure bisection from [0, answer)
    true = {"half": answer // 2, "answer-1": answer - 1}.get(true, true)
    if true >= answer:
        pytest.skip("the predicted answer fits")
    steps = []

    def fake(model, args, kwargs, opts):
        steps.append(opts.batch_size)
        return SimpleNamespace(peak_bytes=0, measured=SimpleNamespace(
            peak_bytes=10 if opts.batch_size <= true else 1_000))

    fit = batch_mod.BatchFit(answer, 0, 100, [], None)
    orig = batch_mod.memory_with
    batch_mod.memory_with = fake
    try:
        out = batch_mod._checked(fit, nn.Linear(2, 2), (torch.randn(1, 2),), {}, ls.MemoryOptions(), 100, {})
    finally:
        batch_mod.memory_with = orig
    assert out.batch_size == true
    # ceil(log2(answer)) + 2
    assert len(steps) <= (answer - 1).bit_length() + 2


def test_progress_bar_only_when_asked(monkeypatch, capsys):
    fit, _ = _run(monkeypatch, CURVES["quadratic"][0])
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""           # the library never prints unless asked
    assert fit.batch_size == 1_464


def test_cli_states_the_real_steps(monkeypatch, capsys):
    # `memory --limit`: the line under the table names the real steps (the scratch-per-sample curve:
    # 2,000 fails, 1,400 fits, the secant's 1,538 fits, 1,539 fails -> 4 real steps)
    from layerscope.cli import main
    real = CURVES["scratch per sample"][0]

    def fake(model, args, kwargs, opts):
        k = opts.batch_size
        return SimpleNamespace(peak_bytes=BASE + PER * k,
                               measured=SimpleNamespace(peak_bytes=real(k)) if opts.measure else None)

    monkeypatch.setattr(batch_mod, "memory_with", fake)
    assert main(["memory", "layerscope.examples:small_cnn", "--infer", "--limit", str(LIMIT)]) == 0
    last = capsys.readouterr().out.rstrip().splitlines()[-1]
    assert last.startswith("largest batch that fits") and ": 1538 " in last
    assert last.endswith("from 6 simulations and 4 real steps"), last
