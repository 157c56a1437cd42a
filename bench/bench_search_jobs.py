"""The search with worker processes (`--jobs N`, planning/search/pool.py) against the serial one: each run
of `layerscope parallel ... --search --format json` in a process of its own, the sides interleaved (A B A
B ...), its wall and CPU seconds (its own and its workers', from getrusage of the children waited for) and
the load average beside; and the answers compared (the whole `search` object but its seconds, and the
chosen plan): they must be equal.

    python bench/bench_search_jobs.py [--jobs 1,2] [--rounds 1] [-- extra layerscope flags]

Default: Llama-2-70B on 64 H100s (the README's first search line)."""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

ARGV = ["parallel", "hf:llama-2-70b", "--input-ids", "1,4096", "--gpus", "64", "--gpu", "H100", "--search"]


def one(jobs: int, extra: list[str]) -> tuple[float, float, dict]:
    code = ("import sys; from layerscope.cli import main; "
            f"sys.exit(main({ARGV + extra + ['--jobs', str(jobs), '--format', 'json', '-q']!r}))")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, json.loads(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("extra", nargs="*")
    ns = ap.parse_args()
    sides = [int(j) for j in ns.jobs.split(",")]
    answers: dict[int, dict] = {}
    for r in range(ns.rounds):
        for jobs in sides:
            load = os.getloadavg()
            wall, cpu, d = one(jobs, ns.extra)
            s = d["search"]
            answer = {k: v for k, v in s.items() if k != "seconds"}
            answer["plan"] = d["plans"][0]
            same = answers.setdefault(jobs, answer) == answer and answers[sides[0]] == answer
            best = s["candidates"][0]
            print(f"round {r} jobs {jobs}: wall {wall:.1f} s, cpu {cpu:.1f} s (all processes), load before "
                  f"{load[0]:.2f}/{load[1]:.2f}; {s['simulated']} simulated, {s['simulated_for_bounds']} for bounds, "
                  f"{s['passes']} passes, counts {s['counts']}; best {best['label']} "
                  f"{best['step_time'] * 1e3:,.1f} ms; same answer as jobs {sides[0]}: {same}", flush=True)
    print("load after", os.getloadavg())


if __name__ == "__main__":
    main()
