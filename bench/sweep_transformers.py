"""Every model class transformers can build from a config, shrunk, through analyze() on CPU and on
meta and a backward on CPU. Prints a table of architecture -> pass / fail / skip with reasons and
the pass rate; asserts nothing.

  python bench/sweep_transformers.py [--mapping base|all] [--only TYPE,...] [--limit N]
                                      [--csv out.csv] [--seconds 60] [--gpu H100]

A class is *skipped* when transformers cannot build it from its default config shrunk to tiny sizes,
or when its own forward fails on the example inputs made for it (token ids, pixel values, audio
features, decoder inputs): then there is nothing for layerscope to analyse. It *passes* when
analyze() on CPU, analyze(device="meta") and analyze(backward=True) (eval mode, as the model's own
forward ran) all return a report (complete,
or with its uncounted ops listed). It *fails* otherwise; a failure that is a LayerscopeError naming
the layer is told apart from an internal crash.
"""

from __future__ import annotations

import argparse
import csv
import gc
import os
import sys
import time
import warnings

import torch


# the harness (shrinking, inputs, one class through analyze): tests/zoo/hf_sweep.py, shared with the CI subset
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from zoo.hf_sweep import _STAGE, one  # noqa: E402


def classes(mapping: str) -> list[tuple[str, str]]:
    import transformers.models.auto.modeling_auto as ma
    tables = ["MODEL_MAPPING_NAMES"] if mapping == "base" else \
        [n for n in dir(ma) if n.startswith("MODEL") and n.endswith("_MAPPING_NAMES")]
    pairs: dict[tuple[str, str], None] = {}
    for n in tables:
        for k, v in getattr(ma, n).items():
            for c in (v if isinstance(v, (list, tuple)) else [v]):
                pairs[(k, c)] = None
    return sorted(pairs)


def _init_worker() -> None:
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()


def _one_row(pair: tuple[str, str], seconds: int, gpu: str | None) -> tuple[str, str, str, str]:
    status, why = one(*pair, seconds, gpu)
    gc.collect()
    return (*pair, status, why)


def _run_all(todo: list[tuple[str, str]], seconds: int, gpu: str | None = None):
    """Each class in a worker process, a fresh worker every 20 classes: what a model leaves behind
    (caches, leaked references) cannot pile up, and a worker the kernel kills for memory costs only
    the class it was running, reported as a fail."""
    from concurrent.futures import ProcessPoolExecutor
    from concurrent.futures.process import BrokenProcessPool

    i = 0
    while i < len(todo):
        with ProcessPoolExecutor(1, initializer=_init_worker, max_tasks_per_child=20) as pool:
            try:
                for pair in todo[i:]:
                    row = pool.submit(_one_row, pair, seconds, gpu).result()
                    i += 1
                    yield row
            except BrokenProcessPool:
                try:
                    with open(_STAGE) as f:
                        stage = f.read()
                except OSError:
                    stage = "analyze"
                # killed while the model itself was built or ran: its own forward does not fit here
                yield (*todo[i], *(("skip", "own: the process was killed (out of memory) building or running "
                                   "it") if stage == "build" else
                                  ("fail", "the worker process died during the analysis (killed for memory?)")))
                i += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mapping", choices=("base", "all"), default="base",
                    help="base: one class per architecture (MODEL_MAPPING); all: every head too")
    ap.add_argument("--only", help="comma-separated model types")
    ap.add_argument("--limit", type=int)
    ap.add_argument("--csv", help="write the rows here as they come")
    ap.add_argument("--resume", metavar="CSV", help="keep the rows of an earlier --csv and run the rest")
    ap.add_argument("--shard", metavar="K/N", help="run only every N-th class from the K-th (0-based): N "
                                                   "processes share the work; merge their --csv files")
    ap.add_argument("--seconds", type=int, default=60, help="per class")
    ap.add_argument("--gpu", help="also analyse on meta with SDPA priced for this GPU (H100, ...), "
                                  "forward and backward")
    ns = ap.parse_args()
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    todo = classes(ns.mapping)
    if ns.only:
        keep = set(ns.only.split(","))
        todo = [p for p in todo if p[0] in keep]
    if ns.limit:
        todo = todo[:ns.limit]
    rows, done = [], set()
    if ns.resume and os.path.exists(ns.resume):
        with open(ns.resume, newline="") as f:
            rows = [tuple(r) for r in csv.reader(f)][1:]
        done = {(r[0], r[1]) for r in rows}
    out = open(ns.csv or os.devnull, "w", newline="")
    writer = csv.writer(out)
    writer.writerow(["model_type", "class", "status", "reason"])
    writer.writerows(rows)
    t0 = time.time()
    left = [p for p in todo if p not in done]
    if ns.shard:
        k, n = (int(v) for v in ns.shard.split("/"))
        left = left[k::n]
        torch.set_num_threads(1)           # the shards share the cores
    for i, row in enumerate(_run_all(left, ns.seconds, ns.gpu)):
        rows.append(row)
        writer.writerow(row)
        out.flush()
        print(f"[{len(done) + i + 1}/{len(todo)}] {row[2]:<4} {row[0]:<28} {row[1]:<44} {row[3]}", flush=True)
    out.close()
    passed = sum(r[2] == "pass" for r in rows)
    failed = [r for r in rows if r[2] == "fail"]
    crashes = [r for r in failed if "CRASH" in r[3]]
    runnable = passed + len(failed)
    print(f"\n{len(rows)} classes in {time.time() - t0:.0f} s: {passed} pass, {len(failed)} fail "
          f"({len(crashes)} internal crashes), {len(rows) - runnable} skip (their own forward does not run "
          f"on tiny inputs); pass rate of runnable {100 * passed / max(runnable, 1):.1f}%")
    for r in failed:
        print(f"  FAIL {r[0]} {r[1]}: {r[3]}")
    sys.exit(0)


if __name__ == "__main__":
    main()
