"""Latency profiler: instrumentation overhead, self-time coverage, run-to-run spread, ranking
stability, and DeepSpeed's FlopsProfiler on the same models. Prints figures; asserts nothing.

  python bench/bench_latency.py [--quick] [--runs 5] [--repeats 10]

For GPT-2 small (batch 1, 128 tokens) and HF ResNet-50 (batch 1, 224x224), real CPU weights,
forward + backward (sum of the output as the loss):
1. ``--runs`` runs of layerscope.profile(backward=True). Per run: the uninstrumented and the
   instrumented forward and backward (medians over the run's repeats; each repeat runs both, in
   turn) and the sum of per-module self times. Targets: instrumented within 5% of uninstrumented;
   sum of self times within 5% of instrumented.
   The overhead is summarized over the runs as the median [min-max] of each run's instrumented /
   uninstrumented ratio (within a run, the median of each repeat's back-to-back pair), "UNTRUSTED" when
   the runs disagree too much (bench/_timing.py: max/min over 1.5 or IQR over 20% of the median).
2. Run-to-run spread: (max - min) / median over the runs of each run's uninstrumented median.
3. Top-5 stability: the five leaf calls with the largest forward self time, per run. "exact": runs
   whose top five (as a set) equal the first run's. "grouped": the same with calls grouped by type
   and shapes (identical layers, such as GPT-2's twelve c_fc, cost the same; their order among
   themselves is noise).
4. The training-loop Profiler: 5 AdamW steps (1 warm-up), the step split into forward, backward,
   optimizer and the rest.
5. DeepSpeed's FlopsProfiler, when installed (forward only; it synchronizes in every hook): a plain
   forward and a profiled one alternate in pairs; per pair, the profiled call's wall time and
   DeepSpeed's own reported latency over the plain forward's time (median [min-max]); then its total
   latency after three calls in one profiling session.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

import layerscope as ls

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import paired_ratios, summarize  # noqa: E402  (bench/ is not a package)


def _models(quick: bool):
    import transformers as T
    torch.manual_seed(0)
    if quick:
        gpt = T.GPT2LMHeadModel(T.GPT2Config(n_layer=2, n_embd=256, n_head=4))
        res = T.ResNetForImageClassification(T.ResNetConfig(depths=[1, 1, 1, 1]))
    else:
        gpt = T.GPT2LMHeadModel(T.GPT2Config())
        res = T.ResNetForImageClassification(T.ResNetConfig())       # ResNet-50
    yield "gpt2-small" if not quick else "gpt2-2layer", gpt.eval(), (torch.randint(0, 50257, (1, 128)),)
    yield "resnet-50" if not quick else "resnet-tiny", res.eval(), (torch.randn(1, 3, 224, 224),)


def _group(r) -> tuple:
    return r.type, r.input_shapes, r.output_shapes


def _top5(rep) -> tuple[list[str], list[tuple]]:
    leaves = [r for r in rep.layers if not r.children]
    top = sorted(leaves, key=lambda r: r.forward_self.median, reverse=True)[:5]
    groups: dict[tuple, list[float]] = {}
    for r in leaves:
        groups.setdefault(_group(r), []).append(r.forward_self.median)
    gtop = sorted(groups, key=lambda g: statistics.median(groups[g]), reverse=True)[:5]
    return [f"{r.name}#{r.call_index}" for r in top], gtop


def profile_runs(name, model, args, runs: int, repeats: int) -> dict:
    rows = []
    for k in range(runs):
        t = time.perf_counter()
        rep = ls.profile(model, *args, warmup=2, repeats=repeats, backward=True)
        wall = time.perf_counter() - t
        tot = rep.totals
        exact, grouped = _top5(rep)
        rows.append({**tot, "exact": exact, "grouped": grouped, "wall": wall})
        print(f"  {name} run {k + 1}: forward {tot['forward_plain'] * 1e3:7.1f} ms plain, "
              f"{tot['forward_instrumented'] * 1e3:7.1f} hooked ({100 * tot['forward_overhead']:+.1f}%), "
              f"self sum {100 * tot['forward_self_sum'] / tot['forward_instrumented']:.1f}% | backward "
              f"{tot['backward_plain'] * 1e3:7.1f} plain, {tot['backward_instrumented'] * 1e3:7.1f} hooked "
              f"({100 * tot['backward_overhead']:+.1f}%), self sum "
              f"{100 * tot['backward_self_sum'] / tot['backward_instrumented']:.1f}% | within-run spread "
              f"{100 * tot['forward_spread']:.1f}% / {100 * tot['backward_spread']:.1f}% | {wall:.0f} s",
              flush=True)

    def med(key):
        return statistics.median(r[key] for r in rows)

    def spread(key):
        v = [r[key] for r in rows]
        return (max(v) - min(v)) / statistics.median(v)

    out = {"model": name, "runs": runs, "repeats": repeats,
           "fwd_overhead": med("forward_overhead"), "bwd_overhead": med("backward_overhead"),
           "fwd_self_share": statistics.median(r["forward_self_sum"] / r["forward_instrumented"] for r in rows),
           "bwd_self_share": statistics.median(r["backward_self_sum"] / r["backward_instrumented"] for r in rows),
           "fwd_plain_ms": med("forward_plain") * 1e3, "bwd_plain_ms": med("backward_plain") * 1e3,
           "fwd_run_spread": spread("forward_plain"), "bwd_run_spread": spread("backward_plain"),
           "fwd_in_run_spread": med("forward_spread"), "bwd_in_run_spread": med("backward_spread"),
           "exact_top5_same": sum(set(r["exact"]) == set(rows[0]["exact"]) for r in rows),
           "grouped_top5_same": sum(set(r["grouped"]) == set(rows[0]["grouped"]) for r in rows),
           "top5_first": rows[0]["exact"], "grouped_first": [g[0] for g in rows[0]["grouped"]],
           "wall_per_run": med("wall"),
           # each run's overhead is already paired: profile() takes the median over its repeats of each
           # repeat's hooked / plain ratio (the two back to back); here the runs' ratios are summarized
           "fwd_ratio": summarize([1 + r["forward_overhead"] for r in rows]),
           "bwd_ratio": summarize([1 + r["backward_overhead"] for r in rows])}
    return out


def training_loop(name, model, args) -> None:
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5)
    prof = ls.Profiler(model, opt, warmup_steps=1)
    with prof:
        for _ in range(5):
            out = model(*args)
            loss = (out.logits if hasattr(out, "logits") else out).float().mean()
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    t = prof.report().totals
    prof.end_profile()
    model.eval()
    print(f"  {name} training loop ({int(t['runs'])} steps): step {t['step'] * 1e3:.1f} ms = forward "
          f"{t['forward'] * 1e3:.1f} + backward {t['backward'] * 1e3:.1f} + optimizer {t['optimizer'] * 1e3:.1f} "
          f"+ other {t['other'] * 1e3:.1f}", flush=True)


def deepspeed_peer(name, model, args) -> None:
    try:
        from deepspeed.profiling.flops_profiler import FlopsProfiler
    except Exception as e:   # not installed, or does not import on this build
        print(f"  DeepSpeed FlopsProfiler: not available ({type(e).__name__}: {str(e)[:80]})")
        return
    reported: list[float] = []

    def plain():
        model(*args)

    def profiled():
        prof = FlopsProfiler(model)
        prof.start_profile()
        model(*args)
        reported.append(prof.get_total_duration())
        prof.stop_profile()
        prof.end_profile()

    with torch.no_grad():
        pair = paired_ratios(plain, profiled, pairs=5, warmup=1)
        own = summarize([d / a for d, a in zip(reported[1:], pair.a)], "pairs")   # reported[0]: the warm-up
        prof = FlopsProfiler(model)
        prof.start_profile()
        model(*args)
        one = prof.get_total_duration()
        model(*args)
        model(*args)
        three = prof.get_total_duration()
        prof.stop_profile()
        prof.end_profile()
    print(f"  {name} DeepSpeed FlopsProfiler: plain forward {pair.a_median * 1e3:.1f} ms; profiled call "
          f"{pair.describe()} of it; its own reported latency {own.describe()} of it; in one session "
          f"{one * 1e3:.1f} ms after 1 call, {three * 1e3:.1f} ms after 3 calls", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small models, 2 runs of 3 repeats")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--only", choices=("gpt2", "resnet"), help="one of the two models")
    ns = ap.parse_args()
    runs, repeats = (2, 3) if ns.quick else (ns.runs, ns.repeats)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {runs} runs of {repeats} repeats "
          "(each repeat: one plain and one instrumented forward + backward)")
    results = []
    for name, model, args in _models(ns.quick):
        if ns.only and not name.startswith(ns.only):
            continue
        results.append(profile_runs(name, model, args, runs, repeats))
        training_loop(name, model, args)
        deepspeed_peer(name, model, args)
        del model
    print("\nmodel          fwd ms  bwd ms  fwd ovh  bwd ovh  fwd self  bwd self  run spread f/b   "
          "top-5 same exact/grouped")
    for r in results:
        print(f"{r['model']:<13} {r['fwd_plain_ms']:7.1f} {r['bwd_plain_ms']:7.1f} {100 * r['fwd_overhead']:+7.1f}% "
              f"{100 * r['bwd_overhead']:+7.1f}% {100 * r['fwd_self_share']:8.1f}% {100 * r['bwd_self_share']:8.1f}%"
              f"   {100 * r['fwd_run_spread']:5.1f}% / {100 * r['bwd_run_spread']:4.1f}%   "
              f"{r['exact_top5_same']}/{r['runs']} exact, {r['grouped_top5_same']}/{r['runs']} grouped")
        print(f"  instrumented / plain over the runs: forward {r['fwd_ratio'].describe()}, backward "
              f"{r['bwd_ratio'].describe()}")
        print(f"  top 5 (run 1): {', '.join(r['top5_first'])}")
        print(f"  top 5 groups (run 1): {', '.join(r['grouped_first'])}")


if __name__ == "__main__":
    main()
