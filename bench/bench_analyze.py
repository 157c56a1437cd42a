"""How much slower is layerscope.analyze() than a plain forward pass? Prints ratios; asserts nothing.

  python bench/bench_analyze.py [--quick]

1. analyze() time / plain no-grad forward time, batch 1, real CPU weights: GPT-2 small (seq 128),
   ViT-B/16 (224), HF ResNet-50 (224). Target <= 3x.
2. A deep MLP of 250, 1,000 and 4,000 blocks: analyze() time per module call must stay flat
   (target: within 1.2x from 250 to 4,000 blocks).
3. Llama-2-70B shape on meta (hidden 8192, 80 layers, 64 heads, 8 KV heads, intermediate 28672,
   vocab 32000, seq 2048): wall time and peak RSS of a fresh process. Target <= 10 s, <= 1.5 GiB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from torch import nn

import layerscope as ls


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _ratio(name: str, model: nn.Module, args: tuple, kwargs: dict, repeats: int) -> dict:
    model.eval()
    with torch.no_grad():
        model(*args, **kwargs)  # warm-up
        fwd = _median_time(lambda: model(*args, **kwargs), repeats)
    ls.analyze(model, *args, **kwargs)  # warm-up
    ana = _median_time(lambda: ls.analyze(model, *args, **kwargs), repeats)
    rep = ls.analyze(model, *args, **kwargs)
    row = {"model": name, "forward_s": fwd, "analyze_s": ana, "ratio": ana / fwd,
           "gmacs": rep.totals.macs / 1e9, "ops": len(rep.trace.ops), "calls": len(rep.layers)}
    print(f"{name:<14} forward {fwd * 1e3:8.1f} ms   analyze {ana * 1e3:8.1f} ms   ratio {ana / fwd:5.2f}x   "
          f"{row['gmacs']:.2f} GMACs, {row['ops']} ops, {row['calls']} module calls", flush=True)
    return row


def real_models(repeats: int) -> list[dict]:
    import transformers as T
    torch.manual_seed(0)
    rows = []
    gpt = T.GPT2Model(T.GPT2Config())
    rows.append(_ratio("gpt2-small", gpt, (torch.randint(0, 50257, (1, 128)),), {}, repeats))
    del gpt
    vit = T.ViTModel(T.ViTConfig())
    rows.append(_ratio("vit-b16", vit, (torch.randn(1, 3, 224, 224),), {}, repeats))
    del vit
    resnet = T.ResNetModel(T.ResNetConfig())  # defaults are ResNet-50
    rows.append(_ratio("resnet50-hf", resnet, (torch.randn(1, 3, 224, 224),), {}, repeats))
    return rows


def deep_mlp(blocks_list: list[int], repeats: int) -> list[dict]:
    rows = []
    for blocks in blocks_list:
        torch.manual_seed(0)
        model = nn.Sequential(*(nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(blocks)))
        x = torch.randn(8, 64)
        with torch.no_grad():
            fwd = _median_time(lambda: model(x), repeats)
        ls.analyze(model, x)
        ana = _median_time(lambda: ls.analyze(model, x), repeats)
        calls = 1 + 3 * blocks
        rows.append({"blocks": blocks, "forward_s": fwd, "analyze_s": ana, "per_call_us": ana / calls * 1e6})
        print(f"mlp {blocks:>5} blocks  forward {fwd * 1e3:8.1f} ms   analyze {ana * 1e3:8.1f} ms   "
              f"{ana / calls * 1e6:6.1f} us per module call   ratio {ana / fwd:5.2f}x", flush=True)
    first, last = rows[0]["per_call_us"], rows[-1]["per_call_us"]
    print(f"per-call time {blocks_list[-1]} vs {blocks_list[0]} blocks: {last / first:.2f}x (target <= 1.2x)")
    return rows


_LLAMA_CHILD = r"""
import json, resource, sys, time, torch
import transformers as T
import layerscope as ls
cfg = T.LlamaConfig(hidden_size=8192, num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                    intermediate_size=28672, vocab_size=32000, max_position_embeddings=4096)
t0 = time.perf_counter()
with torch.device("meta"):
    model = T.LlamaForCausalLM(cfg)
t1 = time.perf_counter()
rep = ls.analyze(model, torch.empty(1, 2048, dtype=torch.long, device="meta"))
t2 = time.perf_counter()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"build_s": t1 - t0, "analyze_s": t2 - t1, "peak_rss": rss, "params": rep.totals.params,
                  "tmacs": rep.totals.macs / 1e12, "complete": rep.totals.complete}))
"""


def llama70b() -> dict:
    out = subprocess.run([sys.executable, "-c", _LLAMA_CHILD], capture_output=True, text=True, check=True)
    row = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"llama-2-70b meta  build {row['build_s']:.2f} s   analyze {row['analyze_s']:.2f} s   peak RSS "
          f"{row['peak_rss'] / 2**30:.2f} GiB (whole process)   {row['params'] / 1e9:.2f} B params   "
          f"{row['tmacs']:.1f} TMACs   complete={row['complete']}", flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="fewer repeats, smaller MLPs")
    p.add_argument("--json", help="also write the figures to this file")
    ns = p.parse_args()
    torch.set_num_threads(max(1, os.cpu_count() or 1))
    repeats = 3 if ns.quick else 5
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    results = {"real": real_models(repeats),
               "mlp": deep_mlp([250, 1000] if ns.quick else [250, 1000, 4000], repeats),
               "llama70b": llama70b()}
    if ns.json:
        with open(ns.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
