"""Which split runs fastest: the uniform split (equal numbers of repeated blocks per stage, the rest
on the first and last stage: torchtitan's default), the min-max split and the step-time split,
each trained under torchrun (gloo, CPU, one process per rank), predicted against measured.

  python bench/bench_split.py [--repeats 3] [--steps 6] [--only gpt2,cnn]

Per model and schedule: the unit times are measured once here (forward and backward of every split
unit, ``partition(by="latency")``) with one thread, as each rank will run with (2 ranks on the 2
cores); the three plans are made from the same times; each is then run ``--repeats`` times under
torchrun, the three plans interleaved (A B C A B C ...) so that a noisy stretch hits all of them.
A run's step time is, per step, the slowest rank's, and its median over the steps after the first
(the first step is not steady state). Prints a markdown table and writes it to
bench/results/split.md (docs/benchmarks.md quotes it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

import layerscope as ls  # noqa: E402
from layerscope.capture.prepare import rebatch  # noqa: E402
from layerscope.pipeline.stages import main_tensor  # noqa: E402
from layerscope.specs import build_model  # noqa: E402
from layerscope.torchrun import launch  # noqa: E402

GPT2 = ("hf:GPT2Config", {"n_layer": 6, "n_embd": 128, "n_head": 4, "vocab_size": 8000, "n_positions": 128,
                          "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 0, "eos_token_id": 0})
CNN = ("bench/pipeline_models.py:stem_cnn", {})
MODELS = {"gpt2": GPT2, "cnn": CNN}
HEAD = {"hf:GPT2Config": "causal-lm"}     # the LM head (and its vocabulary-sized matmul) on the last stage
# (schedule, stages): 2 ranks each
SCHEDULES = [("1f1b", 2), ("gpipe", 2), ("interleaved", 4)]
BATCH, MICRO = 16, 4


def plans(spec, overrides, schedule, stages):
    torch.manual_seed(0)
    built = build_model(spec, "cpu", overrides, head=HEAD.get(spec))
    args, kwargs = built.default_inputs(torch.device("cpu"))
    args, kwargs = rebatch(args, kwargs, 0, BATCH)
    if "vocab_size" in overrides:        # token ids in the vocabulary, as each rank draws them
        kwargs = {k: torch.randint(0, overrides["vocab_size"], v.shape) if not v.is_floating_point() else v
                  for k, v in kwargs.items()}
    # the run's loss (torchrun's mean squared error against a target of the output's shape)
    loss = lambda o: (main_tensor(o).float() - main_tensor(o).detach().float()).pow(2).mean()  # noqa: E731
    common = dict(stages=stages, schedule=schedule, microbatches=MICRO, optimizer="sgd", loss_fn=loss, **kwargs)
    timed = ls.partition(built.model, *args, by="latency", objective="bottleneck", latency_repeats=7, **common)
    # the other two from the same unit times (no second measurement to differ by noise)
    from layerscope.pipeline import build_plan
    out = {"uniform": build_plan(timed.units, stages=stages, by="latency", memory_limit=None, schedule=schedule,
                                 microbatches=MICRO, objective="uniform"),
           "min-max": timed,
           "step time": build_plan(timed.units, stages=stages, by="latency", memory_limit=None,
                                   schedule=schedule, microbatches=MICRO, objective="step_time")}
    return out


def measured_step(res) -> float:
    steps = len(res.ranks[0]["times"])
    per_step = [max(r["times"][i] for r in res.ranks) for i in range(steps)]
    return statistics.median(per_step[1:] if steps > 1 else per_step)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--only", default="gpt2,cnn")
    a = ap.parse_args()
    torch.set_num_threads(1)
    lines = ["| model | schedule | split | cuts | predicted step | measured step (median of runs; min-max) "
             "| predicted / measured | throughput vs uniform |", "|---|---|---|---|---|---|---|---|"]
    for name in a.only.split(","):
        spec, overrides = MODELS[name]
        for schedule, stages in SCHEDULES:
            ps = plans(spec, overrides, schedule, stages)
            runs = {k: [] for k in ps}
            for _ in range(a.repeats):
                for k, p in ps.items():
                    t0 = time.perf_counter()
                    res = launch(spec, overrides=overrides, stages=stages, schedule=schedule, microbatches=MICRO,
                                 batch_size=BATCH, steps=a.steps, optimizer="sgd", head=HEAD.get(spec),
                                 partition_options={"cuts": list(p.split_points)})
                    runs[k].append(measured_step(res))
                    print(f"{name} {schedule} {k}: {runs[k][-1] * 1e3:.1f} ms ({time.perf_counter() - t0:.0f} s)",
                          file=sys.stderr, flush=True)
            base = statistics.median(runs["uniform"])
            for k, p in ps.items():
                m = statistics.median(runs[k])
                lines.append(f"| {name} | {schedule} ({stages} stages) | {k} | {', '.join(p.split_points)} | "
                             f"{p.step_time * 1e3:.1f} ms | {m * 1e3:.1f} ms ({min(runs[k]) * 1e3:.1f}-"
                             f"{max(runs[k]) * 1e3:.1f}) | {p.step_time / m:.2f} | {base / m:.2f}x |")
            print("\n".join(lines[-3:]), flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "bench", "results", "split.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
