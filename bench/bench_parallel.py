"""Sharded training: each rank's predicted peak (layerscope.parallel) against measurements that do not use
layerscope's tracker, and losses against one process.

Part 1, the same rank's real step in one process (``--fake``): real tensors, torch's own FSDP2 / DTensor /
checkpoint code, the collectives on torch's ``fake`` backend (they move no data); the peak from the CPU
allocator's events (``parallel.real.measure_one_rank``). The prediction uses backend="fake" (no gloo
buffers). This checks the simulation of torch's code, every configuration, exactly reproducibly.

Part 2, real runs under torchrun:
For each configuration: the real run (``layerscope.torchrun.launch_parallel``: every rank builds the
model from its spec with the same seed, applies the configuration with torch's FSDP2 / DTensor TP /
checkpoint wrappers, trains 3 AdamW steps on its slice of a global batch; its peak per step from the
CPU allocator's own running total of every thread's blocks (libc10's memory reporter,
``capture.measure.count_cpu_allocations``), not layerscope's tracker), then the prediction
(``layerscope.parallel`` on a meta copy of the same model, device="cpu", the same loss: fp32
cross-entropy on the logits, each rank's local batch). Each rank's largest per-step peak against the
simulated peak (gloo's own buffers included) and against the band up to the simulated peak plus the
"gloo late free" estimate (a reduce-scatter's clone gloo's worker thread may free after the step has
gone on: on some ranks of a run and not others).

Run: python bench/bench_parallel.py [--quick] [--gpt2] [--fake | --gloo]
  (--quick: one configuration per family; --gpt2: GPT-2 (fused QKV) instead of Llama; --fake or --gloo:
  that part only)
"""
from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

import layerscope as ls
from layerscope.options import ParallelConfig
from layerscope.specs import build_model
from layerscope.torchrun import launch_parallel

LLAMA = ("hf:LlamaConfig", {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128})
GPT2 = ("hf:GPT2Config", {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 128, "n_positions": 64,
                          "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})
BATCH = (4, 16)          # the global batch: (samples, tokens)


def cases(quick: bool):
    shapes = [dict(gpus=2), dict(gpus=2, tp=2), dict(gpus=4, tp=2)]
    acs = ["none"] if quick else ["none", "full", "selective-op"]
    mps = ["off"] if quick else ["off", "bf16"]
    return [dict(**s, ac=ac, mixed_precision=mp) for s in shapes for ac in acs for mp in mps]


def predict(spec, overrides, config: ParallelConfig):
    model = build_model(spec, "meta", overrides, "causal-lm").model
    dp = config.dp
    rows = BATCH[0] // dp
    ids = torch.zeros(rows, BATCH[1], dtype=torch.long)
    labels = torch.zeros(rows, BATCH[1], dtype=torch.long)

    def loss_fn(out):        # the real run's loss (parallel/real.py training_loss)
        return F.cross_entropy(out.logits.flatten(0, 1).float(), labels.flatten(0, 1))
    return ls.parallel(model, ids, config=config, device="cpu", optimizer="adamw", steps=3, loss_fn=loss_fn)


def fake_part(spec, overrides) -> None:
    from layerscope.parallel.real import measure_one_rank
    g = torch.Generator().manual_seed(0)
    ids, labels = torch.randint(0, 128, (2, 32), generator=g), torch.randint(0, 128, (2, 32), generator=g)

    def loss_fn(out):
        return F.cross_entropy(out.logits.flatten(0, 1).float(), labels.flatten(0, 1))
    shapes = [dict(gpus=2), dict(gpus=2, tp=2), dict(gpus=4, tp=2), dict(gpus=4, ac="full"),
              dict(gpus=4, tp=2, ac="selective-op"), dict(gpus=4, ac="selective-layer"), dict(gpus=4, replicate=2),
              dict(gpus=2, reshard_after_forward=False)]
    print(f"Part 1: {spec} {overrides}, local batch 2x32, AdamW, 3 steps, rank 0, collectives on the fake backend")
    print("| configuration | mixed precision | measured (B) | predicted (B) | error |")
    print("|---|---|---:|---:|---:|")
    errors = []
    for kw in shapes:
        for mp in ("off", "bf16"):
            config = ParallelConfig(mixed_precision=mp, **kw)
            measured = measure_one_rank(lambda: build_model(spec, "cpu", overrides, "causal-lm").model, config, 0,
                                        ids, labels, steps=3).peak_bytes
            rep = ls.parallel(build_model(spec, "meta", overrides, "causal-lm").model, ids, config=config,
                              device="cpu", backend="fake", steps=3, loss_fn=loss_fn)
            pred = rep.plan.ranks[0].peak_bytes
            errors.append(pred / measured - 1)
            print(f"| {config.label()} | {mp} | {measured:,} | {pred:,} | {pred / measured - 1:+.2%} |", flush=True)
    print(f"\nerrors from {min(errors):+.2%} to {max(errors):+.2%}; {sum(abs(e) <= 0.05 for e in errors)} of "
          f"{len(errors)} within 5%\n")


def main() -> None:
    spec, overrides = GPT2 if "--gpt2" in sys.argv else LLAMA
    if "--gloo" not in sys.argv:
        fake_part(spec, overrides)
    if "--fake" in sys.argv:
        return
    print(f"{spec} {overrides}, global batch {BATCH[0]}x{BATCH[1]}, AdamW, 5 steps (3 measured), torch {torch.__version__}")
    print("| ranks | fsdp | tp | ac | mixed precision | loss rel diff | grad rel diff | simulated (B) | gloo late free "
          "(B) | measured per rank (B) | measured / simulated - 1 | outside the band | s |")
    print("|---:|---:|---:|---|---|---:|---:|---:|---:|---|---|---:|---:|")
    worst_all, sim_errors = [], []
    for kw in cases("--quick" in sys.argv):
        config = ParallelConfig(**kw)
        t = time.perf_counter()
        real = launch_parallel(spec, config, input_ids=BATCH, steps=5, overrides=overrides)
        rep = predict(spec, overrides, config)
        sims = {rep.plan.ranks[r].simulated_peak_bytes for r in range(config.world)}
        lates = {rep.plan.ranks[r].breakdown["gloo late free (estimate)"] for r in range(config.world)}
        errs, outside = [], 0.0
        for r, measured in enumerate(real.peak_bytes):
            sim = rep.plan.ranks[r].simulated_peak_bytes
            top = rep.plan.ranks[r].peak_bytes        # the simulation plus the estimate
            errs.append(measured / sim - 1)
            # the distance from the band [simulated, simulated + estimate], relative to the measurement
            outside = max(outside, max(sim - measured, measured - top, 0) / measured)
        sim_errors += errs
        worst_all.append(outside)
        print(f"| {config.world} | {config.fsdp} | {config.tp} | {config.ac} | {config.mixed_precision} | "
              f"{real.max_rel_loss_diff:.1e} | {real.max_rel_grad_diff:.1e} | {'/'.join(f'{v:,}' for v in sorted(sims))} | "
              f"{'/'.join(f'{v:,}' for v in sorted(lates))} | {', '.join(f'{m:,}' for m in real.peak_bytes)} | "
              f"{', '.join(f'{e:+.1%}' for e in errs)} | {outside:.1%} | {time.perf_counter() - t:.0f} |", flush=True)
    within = sum(abs(e) <= 0.05 for e in sim_errors)
    print(f"\n{sum(e <= 0.05 for e in worst_all)} of {len(worst_all)} configurations: every rank within 5% of the band "
          f"[simulated, simulated + gloo late free]; {within} of {len(sim_errors)} ranks within 5% of the simulation "
          f"alone (measured / simulated - 1 from {min(sim_errors):+.1%} to {max(sim_errors):+.1%})")


if __name__ == "__main__":
    main()
