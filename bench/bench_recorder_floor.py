"""How close can a module-hook and dispatch-mode tool get to torch's floor? Prints figures; asserts nothing.

  python bench/bench_recorder_floor.py [--blocks 250,1000,4000,16000] [--rounds 7]

Issue 36 item 1 bounds analyze()'s extra time per module call at 1.2x torch's floor: an empty forward
pre-hook and forward hook on every module (installed and removed per run) and an empty
TorchDispatchMode (bench/bench_analyze.py ``_torch_floor``). This asks what the least a recorder can do
costs on top of that floor: the same hooks and mode, but the hooks note (module, op count) on a list and
the mode notes (op, input shapes, output shape) -- the least from which per-layer FLOPs could be computed
after the run -- with the cyclic garbage collector paused as analyze() pauses it. Beside them analyze()
itself, which also follows every tensor to the op that made it (dataflow), prices each op as it runs and
freezes the records into a report.

Model: the deep MLP of bench_analyze.py (blocks of Sequential(Linear(64, 64), ReLU()): 3 module calls and
3 ops each, batch 8, no grad). The four sides run in rounds, the order reversed every other round, so a
drifting machine favours none; the extra time per module call is (median - plain median) / calls, and
each round's own extras give the min-max of the two ratios to the floor.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import layerscope as ls


class _Empty(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class _Minimal(TorchDispatchMode):
    def __init__(self, ops: list) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((func, [a.shape for a in args if isinstance(a, torch.Tensor)],
                         out.shape if isinstance(out, torch.Tensor) else None))
        return out


def _hooked(model: nn.Module, fn, minimal: bool):
    def run():
        ops, calls, stack = [], [], []
        if minimal:
            def pre(m, a):
                stack.append(len(calls))
                calls.append([m, len(ops), -1])

            def post(m, a, o):
                calls[stack.pop()][2] = len(ops)
        else:
            def pre(m, a):
                return None

            def post(m, a, o):
                return None
        handles = []
        for m in model.modules():
            handles.append(m.register_forward_pre_hook(pre))
            handles.append(m.register_forward_hook(post))
        paused = minimal and gc.isenabled()
        if paused:
            gc.disable()
        try:
            with _Minimal(ops) if minimal else _Empty():
                fn()
        finally:
            if paused:
                gc.enable()
            for h in handles:
                h.remove()
    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", default="250,1000,4000,16000")
    ap.add_argument("--rounds", type=int, default=7)
    ns = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, {ns.rounds} rounds")
    for n in (int(x) for x in ns.blocks.split(",")):
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(n)))
        x = torch.randn(8, 64)

        def plain():
            with torch.no_grad():
                model(x)
        sides = {"plain": plain, "floor": _hooked(model, plain, False), "minimal": _hooked(model, plain, True),
                 "analyze": lambda: ls.analyze(model, x)}
        for f in sides.values():
            f()
        times: dict[str, list[float]] = {k: [] for k in sides}
        for r in range(ns.rounds):
            for k in (list(sides) if r % 2 == 0 else list(reversed(sides))):
                t0 = time.perf_counter()
                sides[k]()
                times[k].append(time.perf_counter() - t0)
        calls = 1 + 3 * n
        med = {k: statistics.median(v) for k, v in times.items()}
        extra = {k: (med[k] - med["plain"]) / calls * 1e6 for k in med}
        per_round = [{k: times[k][r] - times["plain"][r] for k in sides} for r in range(ns.rounds)]
        spread = {k: [p[k] / p["floor"] for p in per_round if p["floor"] > 0] for k in ("minimal", "analyze")}
        print(f"{n:>6} blocks: extra us per module call: floor {extra['floor']:.1f}, minimal recorder "
              f"{extra['minimal']:.1f} ({extra['minimal'] / extra['floor']:.2f}x the floor, rounds "
              f"{min(spread['minimal']):.2f}-{max(spread['minimal']):.2f}), analyze {extra['analyze']:.1f} "
              f"({extra['analyze'] / extra['floor']:.2f}x, rounds {min(spread['analyze']):.2f}-"
              f"{max(spread['analyze']):.2f})", flush=True)


if __name__ == "__main__":
    main()
