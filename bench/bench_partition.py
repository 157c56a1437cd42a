"""How long planning takes: the exact min-max programme alone, and partition() of a real model,
each as a ratio to a baseline measured beside it (A B A B ..., bench/_timing.py).

  python bench/bench_partition.py [--pairs 5]

1. The programme (``layerscope.pipeline.partition.solve``) on 1,000 random units into 64 stages,
   1F1B, 8 micro-batches, no memory limit and a limit that binds: seconds, and the ratio to the
   unbanded programme (the same answer; checked). Issue 23's target: under 1 s.
2. ``partition()`` of GPT-2 small (12 layers, transformers' GPT2LMHeadModel from its config, no
   download), a batch of 8 x 128 in 4 micro-batches, 2 stages, AdamW: the ratio to a plain no-grad
   forward of the whole batch, and the seconds of its parts (the memory simulation, the measured
   working memory, the programme).
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
from _timing import no_grad, paired_ratios  # noqa: E402

from layerscope.pipeline import SplitUnits, Unit  # noqa: E402
from layerscope.pipeline.partition import _solve, _Tables, solve  # noqa: E402
from layerscope.trace import Costs  # noqa: E402


def random_units(n: int, seed: int = 1) -> SplitUnits:
    rng = random.Random(seed)
    us = tuple(Unit(index=i, name=f"u{i}", paths=(f"u{i}",), type="X", params=(p := rng.randint(0, 100)),
                    param_bytes=p, grad_bytes=p, optimizer_bytes=0, saved_bytes=rng.randint(0, 50),
                    input_bytes=rng.randint(0, 20), output_bytes=rng.randint(0, 20),
                    forward=Costs(flops=rng.randint(1, 1000)), backward=Costs()) for i in range(n))
    return SplitUnits("random", us)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=5)
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
    r = paired_ratios(fwd, lambda: ls.partition(m, ids, stages=2, microbatches=4, optimizer="adamw"),
                      pairs=a.pairs, warmup=0)
    print(f"partition() of GPT-2 small (8 x 128, 4 micro-batches, 2 stages, AdamW) / a plain forward: "
          f"{r.describe()}; forward {r.a_median:.2f} s, partition {r.b_median:.2f} s")


if __name__ == "__main__":
    main()
