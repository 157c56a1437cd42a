"""Issue 58, item 2: max_batch_size's real (measured) steps never ask the host for more than it has.
`layerscope memory layerscope.examples:small_cnn --limit 80gib` ran real CPU steps at the simulation's
answer (batch 160,075: 80 GiB) until the kernel killed the process (22 GB, exit 137). A real step now
runs only where its simulated peak less the weights already held, + 25% + 512 MiB
(``REAL_STEP_MARGIN``), fits in the memory available; above that the answer is the simulation's, and
``BatchFit.notes`` says so. Every test here fakes the available memory LOW and replaces the real-step
measurement with one that fails the test, so nothing here allocates more than a few MiB: on the code
before the fix ``capture.measure.available_bytes`` did not exist, and the monkeypatch fails first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

import layerscope as ls
import layerscope.api._batch as batch_mod
import layerscope.analyses.memory_step as memory_mod
from layerscope.capture import measure
from layerscope.capture.prepare import rebatch
from layerscope.cli import main
from layerscope.errors import InputError
from layerscope.examples import small_cnn

GIB = 2 ** 30


@pytest.fixture
def small_host(monkeypatch):
    """1 GiB available, and a real step that fails the test if it runs."""
    monkeypatch.setattr(measure, "available_bytes", lambda device: GIB)

    def no_real_step(*a, **k):
        raise AssertionError("a real step ran")
    monkeypatch.setattr(memory_mod, "measure_cpu", no_real_step)
    monkeypatch.setattr(memory_mod, "measure_cuda", no_real_step)


def test_80gib_is_answered_by_the_simulation(small_host):
    fit = ls.max_batch_size(small_cnn(), torch.randn(1, 3, 32, 32), limit="80GiB")
    assert fit.real_steps == 0 and fit.measured == ()
    peaks = dict(fit.samples)
    # per sample at the peak (the backward, large batches): the input 3x32x32x4 = 12,288 B, the
    # output 10x4 = 40 B, six 16x32x32 fp32 maps saved for backward (6 x 65,536 = 393,216 B) and two
    # in flight (131,072 B): 536,616 B; 80 GiB / 536,616 B = 160,078.6, less the fixed part -> 160,075
    assert fit.batch_size == 160_075
    assert peaks[160_076] - peaks[160_075] == 12_288 + 40 + 6 * 65_536 + 2 * 65_536 == 536_616
    assert peaks[160_075] <= 80 * GIB < peaks[160_076]             # proved by two simulations
    (note,) = fit.notes
    assert note.startswith("the simulation's answer, not checked by a real step: batch 160075's real step")
    assert "the host has 1.00 GiB available" in note and "may be smaller" in note


def test_cli_80gib_finishes_with_the_simulation_answer(small_host, capsys):
    assert main(["memory", "layerscope.examples:small_cnn", "--limit", "80gib"]) == 0
    out = capsys.readouterr().out
    assert "largest batch that fits 80.00 GiB: 160075 (predicted peak 80.00 GiB), from 6 simulations\n" in out
    assert "  note: the simulation's answer, not checked by a real step" in out
    assert "not found" not in out


def test_measure_refused_before_the_real_step(small_host):
    # small_cnn at batch 4,096: simulated peak ~2 GiB (524,288 B per sample); + 25% + 512 MiB > 1 GiB
    model = small_cnn()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(InputError, match=r"measure=True refused: the real step at batch 4096 would need .* "
                                         r"and the host has 1.00 GiB available"):
        ls.memory(model, torch.randn(1, 3, 32, 32), batch_size=4096, measure=True)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def test_a_step_the_host_cannot_hold_midway_is_not_run(monkeypatch):
    # simulated peaks BASE + PER * k, measured 30 bytes more per sample (the answer 1,538 by
    # test_max_batch_real_steps' hand derivation); the host has room for the first real step (at
    # the predicted 2,000) and none after it: every later step is refused, so the answer is 0 (never
    # a batch not shown to fit) and one note says why
    base, per = 1_000, 100
    limit = base + per * 2_000
    free = iter([10 * GIB])
    monkeypatch.setattr(measure, "available_bytes", lambda device: next(free, 1))
    steps = []

    def fake(model, args, kwargs, opts):
        if opts.measure:
            steps.append(opts.batch_size)
        return SimpleNamespace(peak_bytes=base + per * opts.batch_size,
                               measured=SimpleNamespace(peak_bytes=base + 130 * opts.batch_size))
    monkeypatch.setattr(batch_mod, "memory_with", fake)
    fit = ls.max_batch_size(nn.Linear(8, 4), torch.randn(1, 8), limit=limit)
    assert steps == [2_000] and fit.batch_size == 0
    (note,) = fit.notes
    # the first refused step's bound is the simulated peak at 2,000 (the smallest simulated batch above
    # it) less the Linear's 36 weights held: 201,000 - 144 = 200,856 B = 196.15 KiB; with the margin
    # 200,856 x 1.25 + 512 MiB = 251,070 + 536,870,912 = 537,121,982 B = 512.24 MiB
    assert "real step would need 512.24 MiB (its predicted 196.15 KiB + 25% + 512.00 MiB" in note
    assert "the host has 1 B available" in note
    assert "so it was not run" in note and "more batches below it were not run either" in note


def test_rebatch_for_a_simulation_allocates_nothing_it_would_not_carry():
    x, ids = torch.randn(1, 3), torch.tensor([[5, 7]])
    # 2**40 rows of 3 floats (12 TiB): made on meta, not repeated for real
    big, = rebatch((x,), {}, 0, 2 ** 40, simulated=True)[0]
    assert big.is_meta and big.shape == (2 ** 40, 3)
    # small integer inputs keep their values (the simulation carries them: capture/known.py)
    (small,), _ = rebatch((ids,), {}, 0, 3, simulated=True)
    assert not small.is_meta and small.tolist() == [[5, 7]] * 3
    # over known.LIMIT elements: meta; and a real step's inputs are real as before
    (over,), _ = rebatch((ids,), {}, 0, 2 ** 22, simulated=True)
    assert over.is_meta
    (real,), _ = rebatch((x,), {}, 0, 4)
    assert not real.is_meta and torch.equal(real, x.expand(4, 3))


def test_an_answer_at_the_search_ceiling_says_at_least(small_host, capsys):
    # --limit 1e12 (931 GiB): small_cnn's 536,616 B per sample fits 1.86 million samples, above the
    # search's ceiling max_batch = 2**20 = 1,048,576: the answer is that ceiling, and a larger batch
    # may fit too, so the CLI says "at least" (it printed a plain 1048576 before)
    fit = ls.max_batch_size(small_cnn(), torch.randn(1, 3, 32, 32), limit="1e12")
    assert fit.batch_size == 1 << 20 and fit.capped
    assert main(["memory", "layerscope.examples:small_cnn", "--limit", "1e12"]) == 0
    assert "largest batch that fits 931.32 GiB: at least 1048576 (the search's ceiling)" in capsys.readouterr().out
    assert not ls.max_batch_size(small_cnn(), torch.randn(1, 3, 32, 32), limit="80GiB").capped
