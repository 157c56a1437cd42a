"""The run table that ``layerscope split --run`` prints after a torchrun run, and the simulated step's
timeline under a plan, against their goldens (tests/goldens/run_table/, tests/goldens/plan_timeline/).

Running torchrun here would be slow and its numbers timed, so each run is a ``RunResult`` built from
fixed numbers (per rank: step times, busy times, the actions' start and end, peaks) over a plan whose
unit times a roofline with given peaks predicts (no timing either). Captured before issue 32's
restructuring, so they prove it changed nothing; a missing golden fails."""

from __future__ import annotations

import pytest
import torch

import layerscope as ls
from layerscope.examples import TinyGPT
from layerscope.torchrun import RunResult

from ...reports.test_goldens import check_golden, terminal

# the probed kernels' scratch differs from CPU to CPU: goldens count it 0 (conftest.py)
pytestmark = pytest.mark.usefixtures("machine_independent_kernels")

ROOF = (1e11, 1e10)           # peak FLOP/s and bytes/s: unit times predicted, not measured


@pytest.fixture(scope="module")
def plans():
    torch.manual_seed(0)
    gpt = TinyGPT(layers=2)
    ids = torch.randint(0, 1000, (4, 16), generator=torch.Generator().manual_seed(0))
    return {
        "1f1b": ls.partition(gpt, ids, stages=2, by="roofline", roofline=ROOF, microbatches=2, optimizer="adamw"),
        "zb": ls.partition(gpt, ids, stages=2, by="roofline", roofline=ROOF, microbatches=2, schedule="zb"),
        "interleaved": ls.partition(gpt, ids, stages=4, by="roofline", roofline=ROOF, microbatches=4,
                                    schedule="interleaved"),
        "flops": ls.partition(gpt, ids, stages=2, microbatches=2, schedule="gpipe"),
    }


@pytest.mark.parametrize("case", ["1f1b", "zb", "interleaved"])
def test_plan_timeline(plans, case, update_goldens):
    """The plan's table with its simulated step drawn below it: plain text and the terminal."""
    plan = plans[case]
    check_golden(f"plan_timeline/{case}.txt", plan.table(), update_goldens)
    check_golden(f"plan_timeline/{case}_terminal_120.txt", terminal(plan, 120), update_goldens)


def _rank(rank, stages, times, busy, blocks=None, **extra) -> dict:
    """One rank's record as a worker writes it (seconds; peaks in bytes)."""
    out = {"rank": rank, "stages": stages, "times": times, "busy": busy,
           "peak_bytes": 3_000_000 + 250_000 * rank, "predicted_bytes": 2_900_000 + 310_000 * rank, **extra}
    if blocks is not None:
        out["blocks"] = [blocks] * len(times)      # (stage, kind, micro-batch, start, end) per action
    return out


def _runs(plans) -> dict[str, RunResult]:
    us = 1e-6
    f = lambda s, k, mb, a, b: (s, k, mb, a * us, b * us)  # noqa: E731
    one_f_one_b = (
        [f(0, "F", 0, 0, 60), f(0, "F", 1, 60, 120), f(0, "B", 0, 420, 650), f(0, "B", 1, 700, 930)],
        [f(1, "F", 0, 130, 230), f(1, "B", 0, 230, 430), f(1, "F", 1, 440, 540), f(1, "B", 1, 540, 740)])
    zero_bubble = [    # zb puts both stages on one rank: input gradients (I) and weight gradients (W)
        f(0, "F", 0, 0, 60), f(1, "F", 0, 60, 160), f(0, "F", 1, 160, 220), f(1, "I", 0, 220, 320),
        f(1, "F", 1, 320, 420), f(0, "W", 0, 420, 560), f(1, "I", 1, 560, 660), f(1, "W", 0, 660, 750),
        f(0, "W", 1, 750, 890), f(1, "W", 1, 890, 980)]
    return {
        # warm steps with every action's times, the co-run slowdown and the machine's speed measured,
        # the gradients compared: every footer line
        "1f1b_every_line": RunResult(
            plan=plans["1f1b"], path="export", reference=(6.93412, 6.90127, 6.86533),
            losses=(6.93412, 6.90127, 6.86534), grad_rel_diff=3.25e-7,
            ranks=(_rank(0, [0], [1.02e-3, 0.98e-3, 1.01e-3], [0.46e-3, 0.45e-3, 0.47e-3], one_f_one_b[0],
                         steady=True, corun=1.31, alone_s=1.2e-3),
                   _rank(1, [1], [1.03e-3, 0.99e-3, 1.00e-3], [0.60e-3, 0.61e-3, 0.59e-3], one_f_one_b[1],
                         steady=True, corun=1.27, alone_s=1.1e-3))),
        # zero bubble's I and W actions on one rank; no co-run or speed measured (a GPU run)
        "zb_gpu": RunResult(
            plan=plans["zb"], path="ownership", reference=(5.5, 5.25), losses=(5.5, 5.25000001),
            return_outputs=False,
            ranks=(_rank(0, [0, 1], [0.99e-3, 0.95e-3], [0.9e-3, 0.92e-3], zero_bubble, steady=True),)),
        # two stages per rank; steps after a warm-up one (not warm), no action times
        "interleaved_warmup": RunResult(
            plan=plans["interleaved"], path="ownership", reference=(7.0, 6.8, 6.7), losses=(7.0, 6.8, 6.7),
            ranks=(_rank(0, [0, 2], [3.1e-3, 1.2e-3, 1.1e-3], [2.0e-3, 0.8e-3, 0.7e-3], corun=1.5),
                   _rank(1, [1, 3], [3.0e-3, 1.3e-3, 1.15e-3], [], corun=1.4))),
        # one step only (--steps 1), a plan without unit times, a measured peak of 0
        "gpipe_first_step": RunResult(
            plan=plans["flops"], path="export", reference=(4.0,), losses=(4.0,),
            ranks=(_rank(0, [0], [2.5e-3], [1.5e-3]), {**_rank(1, [1], [2.6e-3], [1.4e-3]), "peak_bytes": 0})),
    }


RUNS = ["1f1b_every_line", "zb_gpu", "interleaved_warmup", "gpipe_first_step"]


@pytest.mark.parametrize("case", RUNS)
def test_run_table(plans, case, update_goldens):
    """What ``split --run`` prints: the plan's table, then the run's."""
    res = _runs(plans)[case]
    check_golden(f"run_table/{case}.txt", res.plan.table() + "\n" + res.table(), update_goldens)


def test_cli_split_run_prints_the_run_table(plans, monkeypatch, capsys):
    """The CLI prints exactly that (torchrun's launch stubbed with the fixed run): compared with the
    golden above, never written from here."""
    import layerscope.torchrun as run
    from layerscope.cli import main
    res = _runs(plans)["1f1b_every_line"]
    monkeypatch.setattr(run, "launch", lambda spec, **kw: res)
    assert main(["split", "layerscope.examples:tiny_gpt", "--stages", "2", "--microbatches", "2", "--run"]) == 0
    check_golden("run_table/1f1b_every_line.txt", capsys.readouterr().out, False)
