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

  python bench/bench_split_speed.py --processes 4 [--against SRC]

3. Whole processes, the issue's measure (issue 61, item 4: at most 2x): ``python -c`` processes that
   import layerscope, build the model and run ``analyze()`` (A) or ``partition()`` (B) once, timed
   in turn A B, B A, ... by the wall clock and by their CPU time (the children's rusage: user +
   system), with the load average before and after. ``--against SRC``: A is ``partition()`` under
   another checkout's ``src`` (a before/after comparison) instead of ``analyze()``.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time

import torch
from torch import nn

import layerscope as ls
from layerscope.planning.split import units as units_mod

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import Paired, paired_ratios  # noqa: E402  (bench/ is not a package)

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
# one side of --processes: the model built as main() builds it, then one call
ONE = """
import torch
from torch import nn
import layerscope as ls
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range({blocks})])
x = torch.randn(1, 64)
{call}
"""
CALLS = {"analyze": "ls.analyze(model, x)", "partition": "ls.partition(model, x, stages={stages})"}


def _process(src: str, call: str, ns) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one whole process running ``call`` under ``src``."""
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    code = ONE.format(blocks=ns.blocks, call=CALLS[call].format(stages=ns.stages))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def processes(ns) -> None:
    """Part 3: whole processes in turn, A B, B A, ... (see the module's docstring)."""
    a_side = ("partition", ns.against) if ns.against else ("analyze", SRC)
    b_side = ("partition", SRC)
    runs: dict[str, list] = {"a": [], "b": []}
    load = os.getloadavg()
    _process(a_side[1], a_side[0], ns)       # untimed: the files in the page cache for both sides
    for k in range(ns.processes):
        for side in (("a", "b") if k % 2 == 0 else ("b", "a")):
            call, src = a_side if side == "a" else b_side
            runs[side].append(_process(src, call, ns))
    a_name = f"partition ({ns.against})" if ns.against else "analyze"
    for i, clock in enumerate(("wall", "CPU")):
        ta, tb = [r[i] for r in runs["a"]], [r[i] for r in runs["b"]]
        p = Paired([y / x for x, y in zip(ta, tb)], ta, tb)
        print(f"3. whole processes, partition / {a_name}, {clock}: {p.describe()}; {a_name} "
              f"{p.a_median:.2f} s, partition {p.b_median:.2f} s")
    print(f"   load average before {load[0]:.1f}, after {os.getloadavg()[0]:.1f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=1000)
    ap.add_argument("--stages", type=int, default=64)
    ap.add_argument("--pairs", type=int, default=3)
    ap.add_argument("--processes", type=int, default=0, help="part 3 only: this many whole processes a side")
    ap.add_argument("--against", default=None, help="with --processes: another checkout's src for side A")
    ns = ap.parse_args()
    if ns.processes:
        processes(ns)
        return
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
