"""How much planning costs on top of analysis: ``partition()`` of a deep MLP into 64 stages against
``analyze()`` of the same model, and where the planning time goes. Prints ratios; asserts nothing.

  python bench/bench_split_speed.py [--blocks 1000] [--stages 64] [--pairs 3]

1. The split units: ``pipeline.units._units`` (which modules to open, which cuts are valid) with its
   incremental cut check against the same search asking the whole-trace ``_Flow.check`` for every
   module it tries (the way it ran before 2026-11-26), on the training trace ``partition`` splits; the
   two sides alternate (bench/_timing.py) and must find the same units.
2. ``partition(model, x, stages=K)`` against ``analyze(model, x)``: the ratio issue 36 item 4 bounds
   (at most 2x), paired the same way, and the time of the training-step simulation ``partition`` runs
   (``memory(..., steps=2)``) beside it.
Model: ``--blocks`` blocks of ``Sequential(Linear(64, 64), ReLU())``, batch 1, CPU weights.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch import nn

import layerscope as ls
from layerscope.planning.split import units as units_mod

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import paired_ratios  # noqa: E402  (bench/ is not a package)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=1000)
    ap.add_argument("--stages", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=3)
    ns = ap.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(ns.blocks)])
    x = torch.randn(1, 64)
    print(f"deep MLP, {ns.blocks} blocks ({3 * ns.blocks + 1} module calls), {ns.stages} stages, torch "
          f"{torch.__version__}, {os.cpu_count()} CPUs")

    flow = units_mod._Flow(ls.memory(model, x, optimizer="adamw", steps=2).trace)
    fast = units_mod._units(flow)
    incremental = units_mod._Opening.cuts

    def whole():
        # the same search, every try answered by the whole-trace check
        units_mod._Opening.cuts = lambda self, units, i, pieces: None
        try:
            return units_mod._units(flow)
        finally:
            units_mod._Opening.cuts = incremental
    assert whole() == fast, "the two searches found different units"
    u = paired_ratios(lambda: units_mod._units(flow), whole, pairs=ns.pairs, warmup=0)
    print(f"1. split units ({len(fast)}): the whole-trace check per try / incremental {u.describe()}; "
          f"incremental {min(u.a):.3f} s, whole {min(u.b):.2f} s")

    p = paired_ratios(lambda: ls.analyze(model, x), lambda: ls.partition(model, x, stages=ns.stages),
                      pairs=ns.pairs, warmup=1)
    t0 = time.perf_counter()
    ls.memory(model, x, optimizer="adamw", steps=2)
    sim = time.perf_counter() - t0
    print(f"2. partition / analyze: {p.describe()}; analyze {min(p.a):.2f} s, partition {min(p.b):.2f} s, of "
          f"which the training-step simulation about {sim:.2f} s")


if __name__ == "__main__":
    main()
