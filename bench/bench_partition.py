"""How long planning takes: the exact min-max programme alone, and partition() of a real model,
each as a ratio to a baseline measured beside it (A B A B ..., bench/_timing.py).

  python bench/bench_partition.py [--pairs 5] [--report 2]

1. The programme (``layerscope.planning.split.partition.solve``) on 1,000 random units into 64 stages,
   1F1B, 8 micro-batches, no memory limit and a limit that binds: seconds, and the ratio to the
   unbanded programme (the same answer; checked). Issue 23's target: under 1 s.
2. ``partition()`` of GPT-2 small (12 layers, transformers' GPT2LMHeadModel from its config, no
   download), a batch of 8 x 128 in 4 micro-batches, 2 stages, AdamW: the ratio to a plain no-grad
   forward of the whole batch, by the wall clock and by CPU time (process_time: both cores' work,
   steadier than the wall on a shared machine), and the CPU seconds of its parts (the memory
   simulation, the measured working memory, the rest: units and the programme). Issue 24's target,
   translated to this machine: 1.85x.
3. With ``--report N``: the README's ``layerscope report hf:gpt2 --set n_layer=4 --input-ids 1,128
   --profile --stages 2`` in this process, N pairs against one plain training pass (forward, loss,
   backward) of the same model and inputs, and the CPU seconds of its parts. Slow (about 100 s a
   run here): off by default.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
from _timing import no_grad, paired_ratios, summarize  # noqa: E402

from layerscope.planning.split import SplitUnits, Unit  # noqa: E402
from layerscope.planning.split.partition import _solve, _Tables, solve  # noqa: E402
from layerscope.trace import Costs  # noqa: E402


def random_units(n: int, seed: int = 1) -> SplitUnits:
    rng = random.Random(seed)
    us = tuple(Unit(index=i, name=f"u{i}", paths=(f"u{i}",), type="X", params=(p := rng.randint(0, 100)),
                    param_bytes=p, grad_bytes=p, optimizer_bytes=0, saved_bytes=rng.randint(0, 50),
                    input_bytes=rng.randint(0, 20), output_bytes=rng.randint(0, 20),
                    forward=Costs(flops=rng.randint(1, 1000)), backward=Costs()) for i in range(n))
    return SplitUnits("random", us)


def _both(what: str, a_name: str, b_name: str, wall, cpu) -> None:
    """One line per clock: the paired ratio and both sides' medians."""
    for name, x in (("wall", wall), ("CPU", cpu)):
        print(f"{what}, {name}: {x.describe()}; {a_name} {x.a_median:.2f} s, {b_name} {x.b_median:.2f} s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--report", type=int, default=0, metavar="N",
                    help="also time the README's report --profile --stages 2 command, N pairs (slow)")
    a = ap.parse_args()
    units = random_units(1000)
    for name, limits in (("no limit", None), ("a 9,000 B limit per stage", [9000.0] * 64)):
        banded = solve(units, 64, "flops", limits, "1f1b", 8)
        full = _solve(_Tables(units, "flops", 8, "1f1b"), 64, limits, "1f1b", 8, 2, None)
        assert banded == full, "the band changed the answer"
        t = time.process_time()
        solve(units, 64, "flops", limits, "1f1b", 8)
        one = time.process_time() - t
        r = paired_ratios(lambda: _solve(_Tables(units, "flops", 8, "1f1b"), 64, limits, "1f1b", 8, 2, None),
                          lambda: solve(units, 64, "flops", limits, "1f1b", 8), pairs=a.pairs, warmup=0)
        print(f"programme, 1,000 units into 64 stages, {name}: {one:.2f} s of CPU; banded / unbanded "
              f"{r.describe()}")

    warnings.filterwarnings("ignore")
    from transformers import GPT2Config, GPT2LMHeadModel

    import layerscope as ls
    torch.manual_seed(0)
    m = GPT2LMHeadModel(GPT2Config()).eval()
    ids = torch.randint(0, 50257, (8, 128))
    fwd = no_grad(lambda: m(ids))
    fwd()

    def part():
        ls.partition(m, ids, stages=2, microbatches=4, optimizer="adamw")
    with parts_timed() as parts:
        r, c = both_clocks(fwd, part, a.pairs)
    _both("partition() of GPT-2 small (8 x 128, 4 micro-batches, 2 stages, AdamW) / a plain forward",
          "forward", "partition", r, c)
    n, total = len(c.b), sum(c.b) / len(c.b)
    print(f"partition() parts, CPU s per run: memory simulation {parts['memory'] / n:.2f}, measured working "
          f"memory {parts['unit_work_bytes'] / n:.2f}, the rest (units, the programme) "
          f"{total - (parts['memory'] + parts['unit_work_bytes']) / n:.2f}; total {total:.2f}")
    if a.report:
        report_line(a.report)


def both_clocks(a, b, pairs: int):
    """paired_ratios by the wall clock, and the same runs' CPU-time ratios (process_time)."""
    cpu: dict[str, list[float]] = {"a": [], "b": []}

    def on_cpu(f, key):
        def run():
            t = time.process_time()
            f()
            cpu[key].append(time.process_time() - t)
        return run
    wall = paired_ratios(on_cpu(a, "a"), on_cpu(b, "b"), pairs=pairs, warmup=0)
    c = summarize([y / x for x, y in zip(cpu["a"], cpu["b"])], "pairs")
    c.a, c.b = cpu["a"], cpu["b"]
    return wall, c


@contextlib.contextmanager
def parts_timed():
    """CPU seconds spent in api.memory, api.profile, api.analyze, api.partition and
    units.unit_work_bytes while the block runs (wrapped where their callers look them up)."""
    import importlib

    import layerscope.api as api
    from layerscope.planning.split import units as units_mod
    # the api's private modules call each other (partition -> memory, profile -> analyze): wrap each
    # function in every module that holds it, so that those inner calls are counted too
    holders = [api] + [importlib.import_module(f"layerscope.api.{m}") for m in
                       ("_analyze", "_batch", "_exported", "_memory", "_onnx", "_partition", "_profile")]
    spent: dict[str, float] = {}
    saved = []
    for home, name in ((api, "memory"), (api, "profile"), (api, "analyze"), (api, "partition"),
                       (units_mod, "unit_work_bytes")):
        f = getattr(home, name)
        spent[name] = 0.0

        def timed(*args, _f=f, _name=name, **kw):
            t = time.process_time()
            try:
                return _f(*args, **kw)
            finally:
                spent[_name] += time.process_time() - t
        for mod in ([home] if home is units_mod else holders):
            if getattr(mod, name, None) is f:
                saved.append((mod, name, f))
                setattr(mod, name, timed)
    try:
        yield spent
    finally:
        for mod, name, f in saved:
            setattr(mod, name, f)


def report_line(pairs: int) -> None:
    import tempfile

    from layerscope.capture.loss import default_loss
    from layerscope.cli import main as cli
    from layerscope.specs import build_model, command_inputs, parse_overrides
    argv = ["report", "hf:gpt2", "--set", "n_layer=4", "--input-ids", "1,128", "--profile", "--stages", "2", "-q"]
    built = build_model("hf:gpt2", "cpu", parse_overrides(["n_layer=4"]), None)
    m = built.model.eval()
    args, kwargs = command_inputs("hf:gpt2", m, built.default_inputs, torch.device("cpu"), input_ids=(1, 128))

    def step():
        m.zero_grad(set_to_none=True)
        default_loss(m(*args, **kwargs)).backward()
        m.zero_grad(set_to_none=True)
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "report.html")

        def report():
            assert cli(argv + ["-o", out]) == 0
        step()
        with parts_timed() as parts:
            r, c = both_clocks(step, report, pairs)
    _both("report hf:gpt2 (4 layers, 1 x 128) --profile --stages 2 / one plain training pass", "pass",
          "report", r, c)
    n, total = len(c.b), sum(c.b) / len(c.b)
    print(f"report parts, CPU s per run: profile() {parts['profile'] / n:.2f}, partition() "
          f"{parts['partition'] / n:.2f} (its measured working memory {parts['unit_work_bytes'] / n:.2f}), the rest "
          f"(building, analyze, memory, the page) {total - (parts['profile'] + parts['partition']) / n:.2f}; "
          f"total {total:.2f}")


if __name__ == "__main__":
    main()
