"""Attention priced as the target GPU runs it (capture/attention.py): what each kernel costs and saves,
and what routing SDPA costs the analysis.

  python bench/bench_attention.py [--layers 12] [--seq 1024] [--batch 8] [--pairs 7]

1. GPT-2 (shrunk to --layers), bf16 weights, a training step with AdamW predicted for each GPU of the
   table: the kernel torch's CUDA rules pick, backward MACs of the forward+backward, saved-for-backward
   bytes and the peak, against the math kernel forced on the same GPU.
2. The cost of routing: analyze() on meta of the same model, with gpu="H100" and without, interleaved
   (A B A B), median of the per-pair ratios.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import torch

import layerscope as ls


def build(layers: int):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(n_layer=layers, attn_implementation="sdpa")
    with torch.device("meta"):
        return GPT2LMHeadModel(cfg).to(torch.bfloat16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--pairs", type=int, default=7)
    ns = ap.parse_args()
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    from layerscope.costs.sdpa import KERNEL_NAMES
    short = {v: k for k, v in KERNEL_NAMES.items()}
    model = build(ns.layers)
    ids = torch.randint(0, 50257, (ns.batch, ns.seq))
    gib = 2 ** 30
    print(f"GPT-2, {ns.layers} layers, bf16, batch {ns.batch} x {ns.seq} tokens, AdamW, device cuda (simulated)")
    print(f"{'GPU':<10} {'kernel':<10} {'bwd MACs':>12} {'saved GiB':>10} {'peak GiB':>9} | "
          f"{'math: bwd MACs':>14} {'saved GiB':>10} {'peak GiB':>9}")
    for name in ls.GPUS:
        row = []
        for forced in ("auto", "math"):
            rep = ls.analyze(model, ids, backward=True, gpu=name, attention=forced)
            mem = ls.memory(model, ids, labels=ids, optimizer="adamw", gpu=name, attention=forced, steps=1)
            kernel = short[next(n for n in rep.notes if n.startswith("attention")).split(" priced as ")[1].split(",")[0]]
            row.append((kernel, rep.totals.backward.macs, mem.totals.saved_activation_bytes / gib,
                        mem.peak_bytes / gib))
        (k, b, s, p), (_, mb, ms, mp) = row
        print(f"{name:<10} {k:<10} {b / 1e9:>10.1f} G {s:>10.3f} {p:>9.3f} | "
              f"{mb / 1e9:>12.1f} G {ms:>10.3f} {mp:>9.3f}")
    # the cost of routing: interleaved pairs on meta, forward only
    ratios = []
    for _ in range(ns.pairs):
        t0 = time.perf_counter()
        ls.analyze(model, ids)
        t1 = time.perf_counter()
        ls.analyze(model, ids, gpu="H100")
        t2 = time.perf_counter()
        ratios.append((t2 - t1) / (t1 - t0))
    print(f"\nanalyze on meta, gpu='H100' over none: {statistics.median(ratios):.2f}x "
          f"[{min(ratios):.2f}-{max(ratios):.2f}] over {ns.pairs} interleaved pairs")


if __name__ == "__main__":
    main()
