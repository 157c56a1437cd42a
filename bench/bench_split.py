"""Which split runs fastest: the uniform split (equal numbers of repeated blocks per stage, the rest
on the first and last stage: torchtitan's default), the min-max split and the step-time split,
each trained under torchrun (gloo, CPU, one process per rank), predicted against measured.

  python bench/bench_split.py [--repeats 3] [--steps 6] [--only gpt2,cnn,wait,wait-wide] [--schedules zb,zbv]

``wait`` and ``wait-wide`` (bench/pipeline_models.py ``wait_chain``): eight units whose forward and
backward are calibrated waits (an operator that sleeps, kept by torch.export), on 1 MiB and 4 MiB
micro-batch activations. A waiting rank holds no core, so the two ranks never contend and the machine's
speed does not enter: what is left to check is the schedule, the sends and their overlap.

Per model and schedule: the unit times are measured once here (forward and backward of every split
unit, ``partition(by="latency")``) with one thread, as each rank will run with (2 ranks on the 2
cores); the three plans are made from the same times; each is then run ``--repeats`` times under
torchrun, the three plans interleaved (A B C A B C ...) so that a noisy stretch hits all of them.
A step's time is the slowest rank's; the table gives the median, min and max over every timed step
of all the runs of a split. Each run measures, before its steps, how much slower its ranks compute
when they compute at once than alone (they share the 2 cores: ``RunResult.corun``); the predicted
step is the plan's simulation with that slowdown, the one "ranks alone" without it (on CPU the run times its steps after the memory-measured ones, without
the profiler: steady state). The same runs also time the whole model alone before their steps: its
time over the units' sum (``RunResult.speed``) is how fast the machine is at the run against when
the units were timed, and the next columns predict with that too. The speed the steps themselves computed
at (``RunResult.step_speed``: in the run's median step, all its actions' durations against the same sum
in the plan's simulated step) is a speed measured during the steps rather than before them; predicting with
it leaves to the model the split's balance, the schedule, the ranks' sharing of the cores and the sends.
The last column is issue 37's item 5c: over the repeats (each run's median step), a preferred split
fails when its median is more than 5% above uniform's and their ranges do not overlap; ``--raw FILE``
keeps every run's figures (JSON lines). Sends across cuts are priced at the
bandwidth of one gloo send measured here first (bench/_gloo_bandwidth.py). Prints a markdown table
and writes it to bench/results/split_MODELS.md (docs/benchmarks.md quotes it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

import layerscope as ls  # noqa: E402
from layerscope.capture.prepare import rebatch  # noqa: E402
from layerscope.planning.split.runnable import main_tensor  # noqa: E402
from layerscope.specs import build_model  # noqa: E402
from layerscope.torchrun import launch  # noqa: E402

GPT2 = ("hf:GPT2Config", {"n_layer": 6, "n_embd": 128, "n_head": 4, "vocab_size": 8000, "n_positions": 128,
                          "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 0, "eos_token_id": 0})
CNN = ("bench/pipeline_models.py:stem_cnn", {})
# calibrated waits in place of compute (issue 37 item 5a): schedule, sends and overlap alone
WAIT = ("bench/pipeline_models.py:wait_chain", {})
MODELS = {"gpt2": GPT2, "cnn": CNN, "wait": WAIT, "wait-wide": ("bench/pipeline_models.py:wait_chain_wide", {})}
HEAD = {"hf:GPT2Config": "causal-lm"}     # the LM head (and its vocabulary-sized matmul) on the last stage
# (schedule, stages): 2 ranks each
SCHEDULES = [("1f1b", 2), ("gpipe", 2), ("interleaved", 4), ("zb", 4), ("zbv", 4)]
BATCH, MICRO = 16, 4


def link_bandwidth() -> float:
    """Bytes per second of one gloo send between two processes here, for a 4 MiB tensor (the
    median of 6 round trips; bench/_gloo_bandwidth.py under torchrun)."""
    import subprocess
    env = dict(os.environ, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                          os.path.join(ROOT, "bench", "_gloo_bandwidth.py")], capture_output=True, text=True,
                         env=env, timeout=300)
    line = next(x for x in out.stdout.splitlines() if x.startswith("{"))
    sizes = {int(k): v for k, v in json.loads(line).items()}
    return (1 << 22) / sizes[1 << 22]


def plans(spec, overrides, schedule, stages, link=None):
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
    timed = ls.partition(built.model, *args, by="latency", objective="bottleneck", latency_repeats=7,
                         link_bandwidth=link, **common)
    # the other two from the same unit times (no second measurement to differ by noise)
    from layerscope.reports.plan_build import build_plan
    out = {"uniform": build_plan(timed.units, stages=stages, by="latency", memory_limit=None, schedule=schedule,
                                 microbatches=MICRO, objective="uniform", link_bandwidth=link),
           "min-max": timed,
           "step time": build_plan(timed.units, stages=stages, by="latency", memory_limit=None,
                                   schedule=schedule, microbatches=MICRO, objective="step_time",
                                   link_bandwidth=link)}
    return out


def measured_steps(res) -> list[float]:
    """Per steady step (on CPU every timed step: they run after the memory-measured ones), the
    slowest rank's seconds."""
    steps = len(res.ranks[0]["times"])
    per_step = [max(r["times"][i] for r in res.ranks) for i in range(steps)]
    return per_step if res.warm or steps == 1 else per_step[1:]


def verdict(preferred: list[float], default: list[float]) -> str:
    """Issue 37 item 5c, over the repeats (each run's median step; the runs interleaved): a preferred
    split fails when its median is more than 5% above the default's and their min-max ranges do not
    overlap."""
    slower = statistics.median(preferred) > 1.05 * statistics.median(default)
    apart = min(preferred) > max(default)
    return ("SLOWER" if slower and apart else "ok" + (" (median >5% above, ranges overlap)" if slower else "")) + \
        f" {statistics.median(default) / statistics.median(preferred):.2f}x [{min(preferred) * 1e3:.0f}-" \
        f"{max(preferred) * 1e3:.0f} vs {min(default) * 1e3:.0f}-{max(default) * 1e3:.0f} ms]"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--only", default="gpt2,cnn")
    ap.add_argument("--schedules", default="1f1b,gpipe,interleaved,zb,zbv")
    ap.add_argument("--raw", help="append every run's figures to this file (JSON lines)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    link = link_bandwidth()
    print(f"gloo send, 4 MiB: {link / 1e9:.2f} GB/s (prices every send across a cut)", file=sys.stderr)
    lines = [f"Sends priced at {link / 1e9:.2f} GB/s (one gloo send of 4 MiB between the two processes).", "","| model | schedule | split | cuts | predicted, ranks alone | co-run slowdown (measured) "
             "| predicted step | measured step: median [min-max] | predicted / measured median (ranks alone) "
             "| schedule replayed with the run's action times / the run's last action end "
             "| machine at the run / when the units were timed | predicted at the run's speed / measured "
             "| throughput vs uniform (medians) | compute speed in the steps / when the units were timed "
             "| predicted at the steps' speed / measured | preferred vs default (5c) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name in a.only.split(","):
        spec, overrides = MODELS[name]
        for schedule, stages in SCHEDULES:
            if schedule not in a.schedules.split(","):
                continue
            ps = plans(spec, overrides, schedule, stages, link)
            runs = {k: [] for k in ps}
            medians = {k: [] for k in ps}   # each run's median step (5c compares the repeats)
            pred = {k: [] for k in ps}    # the prediction with each run's measured co-run slowdown
            coruns = {k: [] for k in ps}
            replays = {k: [] for k in ps}   # the schedule simulated with the run's own action times
            speeds = {k: [] for k in ps}    # the machine's speed at the run against when the units were timed
            at_speed = {k: [] for k in ps}  # the prediction with it
            step_speeds = {k: [] for k in ps}  # the speed the run's own steps computed at
            at_steps = {k: [] for k in ps}     # the prediction with it
            for _ in range(a.repeats):
                for k, p in ps.items():
                    t0 = time.perf_counter()
                    res = launch(spec, overrides=overrides, stages=stages, schedule=schedule, microbatches=MICRO,
                                 batch_size=BATCH, steps=a.steps, optimizer="sgd", head=HEAD.get(spec),
                                 partition_options={"cuts": list(p.split_points)})
                    got = measured_steps(res)
                    runs[k] += got
                    medians[k].append(statistics.median(got))
                    pred[k].append(res.predict(p).step_time)
                    coruns[k].append(res.corun)
                    speeds[k].append(res.speed(p) or 1.0)
                    at_speed[k].append(res.predict(p, at_run_speed=True).step_time)
                    sim, end = res.replay()
                    replays[k].append(sim / end)
                    step_speeds[k].append(res.step_speed(p) or 1.0)
                    at_steps[k].append(res.predict(p, at_step_speed=True).step_time)
                    if a.raw:
                        with open(a.raw, "a") as f:
                            f.write(json.dumps({"model": name, "schedule": schedule, "split": k,
                                                "cuts": list(p.split_points), "steps": got,
                                                "alone": p.step_time,
                                                "predicted": pred[k][-1], "corun": res.corun,
                                                "speed": speeds[k][-1], "at_speed": at_speed[k][-1],
                                                "step_speed": step_speeds[k][-1], "at_steps": at_steps[k][-1],
                                                "replay": [sim, end]}) + "\n")
                    print(f"{name} {schedule} {k}: {[round(x * 1e3) for x in got]} ms, co-run "
                          f"x{res.corun:.2f}, predicted {pred[k][-1] * 1e3:.0f} ms, machine "
                          f"x{speeds[k][-1]:.2f} ({at_speed[k][-1] * 1e3:.0f} ms), steps x{step_speeds[k][-1]:.2f} "
                          f"({at_steps[k][-1] * 1e3:.0f} ms) "
                          f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
            base = statistics.median(runs["uniform"])
            for k, p in ps.items():
                m, lo = statistics.median(runs[k]), min(runs[k])
                pc = statistics.median(pred[k])
                lines.append(f"| {name} | {schedule} ({stages} stages) | {k} | {', '.join(p.split_points)} | "
                             f"{p.step_time * 1e3:.0f} ms | x{statistics.median(coruns[k]):.2f} | {pc * 1e3:.0f} ms | "
                             f"{m * 1e3:.0f} ms [{lo * 1e3:.0f}-{max(runs[k]) * 1e3:.0f}, "
                             f"{len(runs[k])} steps] | {pc / m:.2f} ({p.step_time / m:.2f}) | "
                             f"{statistics.median(replays[k]):.2f} | x{statistics.median(speeds[k]):.2f} | "
                             f"{statistics.median(at_speed[k]) / m:.2f} | {base / m:.2f}x | "
                             f"x{statistics.median(step_speeds[k]):.2f} | {statistics.median(at_steps[k]) / m:.2f} | "
                             f"{verdict(medians[k], medians['uniform']) if k != 'uniform' else '--'} |")
            print("\n".join(lines[-3:]), flush=True)
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.join(ROOT, "bench", "results"), exist_ok=True)
    tag = a.only.replace(",", "_") + ("" if a.schedules == ap.get_default("schedules") else
                                      "_" + a.schedules.replace(",", "_"))
    with open(os.path.join(ROOT, "bench", "results", f"split_{tag}.md"), "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
