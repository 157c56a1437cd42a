"""analyze()'s extra time against FlopCounterMode's, the code under test against another checkout, interleaved.
Prints figures; asserts nothing.

  python bench/bench_analyze_speed.py [--base SRC] [--models mlp,resnet50] [--pairs 5] [--rounds 5] [--blocks 1000]

The measure of issue 61 item 5: a tool's extra time is its run minus a plain no-grad forward of the same
model and input; analyze()'s extra time over FlopCounterMode's (the ratio, whatever the number of module
calls: per module call on the deep MLP it is the same ratio) for
  - mlp: the deep MLP of bench/speed.py (blocks of Sequential(Linear(64, 64), ReLU()), batch 8, 3 module
    calls per block), target <= 0.7;
  - resnet50: transformers' ResNetModel(ResNetConfig()) (ResNet-50, built locally), batch 1 at 224x224,
    target <= 0.9.
Each measurement is a fresh child process that imports layerscope from one ``src`` (this checkout's, or
``--base``: another checkout's, e.g. ``git worktree add /tmp/base <commit> --detach``), warms every side
up, then runs ``--rounds`` rounds of (plain, analyze, FlopCounterMode), the order reversed every other
round; before each timed side a full collection (untimed), and each side's time ends with a
generation-0 collection (what it left the collector is walked in its own time). The parent
alternates the two checkouts' children (A B B A ...), ``--pairs`` of each, so a drifting machine
favours neither. CPU time (time.process_time: this process alone, whatever else the
machine runs) is the figure; wall beside it. Each child's ratio is of the medians of its rounds' extras;
the parent prints the median of the children's ratios with their min and max, and the load average.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(os.path.dirname(HERE), "src")


def _model(name: str, blocks: int):
    import torch
    from torch import nn
    torch.manual_seed(0)
    if name == "mlp":
        m = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(blocks)))
        return m.eval(), torch.randn(8, 64), 1 + 3 * blocks
    if name == "resnet50":
        import transformers as T
        m = T.ResNetModel(T.ResNetConfig()).eval()      # the config's defaults are ResNet-50
        return m, torch.randn(1, 3, 224, 224), sum(1 for _ in m.modules())
    raise SystemExit(f"unknown model {name!r} (mlp, resnet50)")


def child(name: str, blocks: int, rounds: int) -> None:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    import layerscope as ls
    m, x, calls = _model(name, blocks)

    def plain():
        with torch.no_grad():
            m(x)

    def analyze():
        with torch.no_grad():
            ls.analyze(m, x)

    def fcm():
        with torch.no_grad(), FlopCounterMode(display=False):
            m(x)
    sides = {"plain": plain, "analyze": analyze, "fcm": fcm}
    for f in sides.values():
        f()
    cpu: dict[str, list[float]] = {k: [] for k in sides}
    wall: dict[str, list[float]] = {k: [] for k in sides}
    for r in range(rounds):
        for k in (list(sides) if r % 2 == 0 else list(reversed(sides))):
            gc.collect()        # (untimed) no side's garbage is left for the next one to walk
            c, w = time.process_time(), time.perf_counter()
            sides[k]()
            # what each side leaves the collector, walked inside its own time: analyze() keeps the
            # collector paused while it runs, and its records would otherwise be walked by the first
            # collection of whichever side runs next
            gc.collect(0)
            cpu[k].append(time.process_time() - c)
            wall[k].append(time.perf_counter() - w)
    print(json.dumps({"cpu": cpu, "wall": wall, "calls": calls}))


def _ratio(times: dict[str, list[float]]) -> tuple[float, float, float]:
    med = {k: statistics.median(v) for k, v in times.items()}
    a, f = med["analyze"] - med["plain"], med["fcm"] - med["plain"]
    return a / f, a, f


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", help="another checkout's src directory to compare against")
    ap.add_argument("--models", default="mlp,resnet50")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--blocks", type=int, default=1000)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ns = ap.parse_args()
    if ns.child:
        return child(ns.child, ns.blocks, ns.rounds)
    srcs = {"this": SRC} if not ns.base else {"base": os.path.abspath(ns.base), "this": SRC}
    print(f"load average before: {' '.join(f'{v:.2f}' for v in os.getloadavg())}; {os.cpu_count()} cores", flush=True)
    for name in ns.models.split(","):
        got: dict[str, list[dict]] = {k: [] for k in srcs}
        for p in range(ns.pairs):
            order = list(srcs) if p % 2 == 0 else list(reversed(srcs))
            for k in order:
                env = {**os.environ, "PYTHONPATH": srcs[k], "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
                out = subprocess.run([sys.executable, __file__, "--child", name, "--blocks", str(ns.blocks),
                                      "--rounds", str(ns.rounds)], env=env, capture_output=True, text=True)
                if out.returncode:
                    raise SystemExit(f"{k} child failed:\n{out.stderr[-3000:]}")
                got[k].append(json.loads(out.stdout.strip().splitlines()[-1]))
        for k, runs in got.items():
            calls = runs[0]["calls"]
            for clock in ("cpu", "wall"):
                rs = [_ratio(r[clock]) for r in runs]
                ratios = [r[0] for r in rs]
                per_a = statistics.median(r[1] for r in rs) / calls * 1e6
                per_f = statistics.median(r[2] for r in rs) / calls * 1e6
                plain = statistics.median(statistics.median(r[clock]["plain"]) for r in runs) * 1e3
                print(f"{name:<9} {k:<5} {clock:<4}: analyze extra / FlopCounterMode extra {statistics.median(ratios):.2f}x "
                      f"[{min(ratios):.2f}-{max(ratios):.2f}] over {len(runs)} processes; per module call "
                      f"{per_a:.1f} vs {per_f:.1f} us ({calls} calls, plain forward {plain:.1f} ms)", flush=True)
    print(f"load average after: {' '.join(f'{v:.2f}' for v in os.getloadavg())}", flush=True)


if __name__ == "__main__":
    main()
