"""``profile()`` against what it cannot do without (issue 36 item 4: at most 1.3x): the passes it times
(every warm-up and timed repeat, with hooks and without) plus its analysis (the ``analyze()`` whose costs
it prints beside the times). Both parts are measured inside the same ``profile()`` call, so the ratio
holds on a drifting machine; prints it per run, with the precision the adaptive repeat rule reached
(``repeats="auto"``: it stops once the medians' 95% intervals are within their tolerances; the least
precise one's half-width over its tolerance is printed, 1.0 at the rule's limit). Asserts nothing.

  python bench/bench_profile_overhead.py [--runs 3] [--only gpt2,mlp,resnet]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
from torch import nn

import layerscope as ls
from layerscope.api import _profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import summarize  # noqa: E402  (bench/ is not a package)


def models():
    import transformers as tf
    torch.manual_seed(0)
    gpt2 = tf.GPT2LMHeadModel(tf.GPT2Config()).eval()
    resnet = tf.ResNetForImageClassification(tf.ResNetConfig()).eval()
    mlp = nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(1000)])
    return {"gpt2": ("GPT-2 small, 1 x 128 tokens", gpt2, {"input_ids": torch.zeros(1, 128, dtype=torch.long)}),
            "resnet": ("HF ResNet-50, 1 x 3 x 224 x 224", resnet, {"input_size": (1, 3, 224, 224)}),
            "mlp": ("deep MLP, 1,000 blocks, 1 x 64", mlp, {"input_size": (1, 64)})}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--only", default="gpt2,mlp,resnet")
    ns = ap.parse_args()
    seen: dict = {}
    analyze, time_calls = _profile.analyze, _profile.time_calls

    def timed_analyze(*a, **k):
        t0 = time.perf_counter()
        try:
            return analyze(*a, **k)
        finally:
            seen["analyze"] = seen.get("analyze", 0.0) + time.perf_counter() - t0

    def watched_time_calls(*a, **k):
        seen["info"] = k["info"]
        return time_calls(*a, **k)
    _profile.analyze, _profile.time_calls = timed_analyze, watched_time_calls
    try:
        table = models()
        print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; profile(repeats='auto', warmup='auto')")
        for key in ns.only.split(","):
            name, model, inputs = table[key]
            ratios, rows = [], []
            for _ in range(ns.runs):
                seen.clear()
                t0 = time.perf_counter()
                rep = ls.profile(model, **inputs)
                total = time.perf_counter() - t0
                floor = seen["analyze"] + seen["info"]["pass_seconds"]
                ratios.append(total / floor)
                o = rep.options
                worst = o.get("least_precise", {})
                rows.append(f"{total:.2f} s against {floor:.2f} s ({seen['analyze']:.2f} analysis + "
                            f"{seen['info']['pass_seconds']:.2f} passes), {o['warmup']} warm-up + {o['repeats']} "
                            f"repeats, {o.get('stopped')}, least precise {worst.get('name')!r} at "
                            f"{worst.get('tolerance_ratio', float('nan')):.2f} of its tolerance")
            r = summarize(ratios)
            print(f"{name}: profile / (passes + analysis) {r.describe()}, median "
                  f"{statistics.median(ratios):.3f}")
            for line in rows:
                print(f"  {line}")
    finally:
        _profile.analyze, _profile.time_calls = analyze, time_calls


if __name__ == "__main__":
    main()
