"""Sharded training: each rank's predicted peak (layerscope.parallel) against measurements that do not use
layerscope's tracker, and losses against one process.

Part 1, the same rank's real step in one process (``--fake``): real tensors, torch's own FSDP2 / DTensor /
checkpoint code, the collectives on torch's ``fake`` backend (they move no data); the peak from the CPU
allocator's events (``parallel.real.measure_one_rank``). The prediction uses backend="fake" (no gloo
buffers). This checks the simulation of torch's code, every configuration, exactly reproducibly.

Part 2, real runs under torchrun:
For each configuration: the real run (``layerscope.torchrun.launch_parallel``: every rank builds the
model from its spec with the same seed, applies the configuration with torch's FSDP2 / DTensor TP /
checkpoint wrappers (a pipeline rank: its stage of the uniform split, torch's PipelineStage and GPipe /
1F1B schedule over 2 micro-batches), trains 5 AdamW steps on its slice of a global batch; its peak per
step from the CPU allocator's own running total of every thread's blocks (libc10's memory reporter,
``capture.measure.count_cpu_allocations``), not layerscope's tracker), then the prediction
(``layerscope.parallel`` on a meta copy of the same model, device="cpu", the same loss: fp32 cross-
entropy on the logits, each rank's local batch, per micro-batch in a pipeline). Each rank's largest per-
step peak against the simulated peak (gloo's own buffers included) and against the band up to the
simulated peak plus the "gloo late free" estimate (a reduce-scatter's clone gloo's worker thread may
free after the step has gone on: on some ranks of a run and not others).

Part 1b (``--stages``, alone): pipeline stages the same way as part 1, torch's PipelineStage and schedule
on the fake backend (``parallel.real.measure_stage_rank``), each stage's first rank.

Part 2b (``--interleaved``, alone): interleaved 1F1B under torchrun (pp 2 x 2 stages per rank, 4 blocks,
4 micro-batches of one sample), Llama and GPT-2 (its tied embedding and head on the two ranks), alone and
with FSDP 2, each rank's peak against the band as in part 2.

Part 2c (``--zero-bubble``, alone): part 2b's runs under the zero-bubble schedules (zb: torch's
ScheduleInterleavedZeroBubble, zbv: ScheduleZBVZeroBubble), FSDP's reshard_after_forward off.

Run: python bench/bench_parallel.py [--quick] [--gpt2] [--fake | --gloo | --stages | --interleaved | --zero-bubble]
  (--quick: one configuration per family; --gpt2: GPT-2 (fused QKV) instead of Llama; --fake, --gloo,
  --stages, --interleaved or --zero-bubble: that part only)
"""
from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

import layerscope as ls
from layerscope.errors import InputError
from layerscope.planning.config import ParallelConfig
from layerscope.specs import build_model
from layerscope.torchrun import launch_parallel

LLAMA = ("hf:LlamaConfig", {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128})
GPT2 = ("hf:GPT2Config", {"n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 128, "n_positions": 64,
                          "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})
BATCH = (4, 16)          # the global batch: (samples, tokens)


def cases(quick: bool):
    shapes = [dict(gpus=2), dict(gpus=2, tp=2), dict(gpus=4, tp=2), dict(gpus=2, fsdp=1, pp=2, microbatches=2),
              dict(gpus=4, pp=2, microbatches=2), dict(gpus=4, fsdp=1, tp=2, pp=2, microbatches=2)]
    acs = ["none"] if quick else ["none", "full", "selective-op"]
    mps = ["off"] if quick else ["off", "bf16"]
    return [dict(**s, ac=ac, mixed_precision=mp) for s in shapes for ac in acs for mp in mps]


def predict(spec, overrides, config: ParallelConfig):
    model = build_model(spec, "meta", overrides, "causal-lm").model
    dp = config.dp
    rows = BATCH[0] // dp
    ids = torch.zeros(rows, BATCH[1], dtype=torch.long)
    labels = torch.zeros(rows, BATCH[1], dtype=torch.long)

    def loss_fn(out, target):   # the real run's loss (planning/real/sharded_run.py training_loss; per micro-batch in a pipeline)
        return F.cross_entropy(out.logits.flatten(0, 1).float(), target.flatten(0, 1))
    return ls.parallel(model, ids, config=config, device="cpu", optimizer="adamw", steps=3, loss_fn=loss_fn,
                       target=labels)


def fake_part(spec, overrides) -> None:
    from layerscope.planning.real.sharded_run import measure_one_rank
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


STAGE_CASES = [dict(gpus=2, pp=2, microbatches=2, schedule="gpipe", mixed_precision="off"),
               dict(gpus=2, pp=2, microbatches=4, schedule="1f1b", mixed_precision="off"),
               dict(gpus=2, pp=2, microbatches=2, schedule="gpipe", mixed_precision="off", ac="full"),
               dict(gpus=2, pp=2, microbatches=2, schedule="gpipe"),
               dict(gpus=2, pp=2, microbatches=2, schedule="1f1b", ac="full"),
               dict(gpus=4, pp=2, microbatches=2, schedule="1f1b"),
               dict(gpus=4, pp=2, microbatches=2, schedule="1f1b", mixed_precision="off", ac="full"),
               dict(gpus=4, pp=2, microbatches=2, schedule="1f1b", ac="full"),
               dict(gpus=4, fsdp=1, tp=2, pp=2, microbatches=2, schedule="1f1b", mixed_precision="off"),
               dict(gpus=4, fsdp=1, tp=2, pp=2, microbatches=2, schedule="gpipe", ac="full"),
               # two stages per rank (4 stages of one block each), torch's ScheduleInterleaved1F1B
               dict(gpus=2, pp=2, microbatches=4, schedule="interleaved", mixed_precision="off"),
               dict(gpus=2, pp=2, microbatches=4, schedule="interleaved"),
               dict(gpus=4, pp=2, microbatches=4, schedule="interleaved", mixed_precision="off"),
               dict(gpus=4, pp=2, microbatches=4, schedule="interleaved", ac="full"),
               dict(gpus=4, fsdp=1, tp=2, pp=2, microbatches=4, schedule="interleaved", mixed_precision="off"),
               # zero bubble: each backward split in I and W; zbv's V puts stages 1 and 2 on one rank (handed over
               # there); with FSDP, reshard_after_forward off (torch's zero bubble needs it: options.py)
               dict(gpus=2, pp=2, microbatches=4, schedule="zb", mixed_precision="off"),
               dict(gpus=2, pp=2, microbatches=4, schedule="zb", ac="full"),
               dict(gpus=4, pp=2, microbatches=4, schedule="zb", ac="full", reshard_after_forward=False),
               dict(gpus=4, fsdp=1, tp=2, pp=2, microbatches=4, schedule="zb", mixed_precision="off"),
               dict(gpus=2, pp=2, microbatches=4, schedule="zbv", mixed_precision="off"),
               dict(gpus=2, pp=2, microbatches=4, schedule="zbv", ac="full"),
               dict(gpus=4, pp=2, microbatches=4, schedule="zbv", mixed_precision="off", reshard_after_forward=False),
               dict(gpus=4, fsdp=1, tp=2, pp=2, microbatches=4, schedule="zbv", ac="full")]


def stages_part(spec, overrides) -> None:
    """Part 1b: pipeline stages the same way (``parallel.real.measure_stage_rank``: torch's PipelineStage
    and schedule, the fake backend), each stage's first rank, a 4-layer model, local batch 4 x 32."""
    from layerscope.planning.real.sharded_run import measure_stage_rank
    overrides = {**overrides, ("n_layer" if "n_layer" in overrides else "num_hidden_layers"): 4}
    g = torch.Generator().manual_seed(0)
    ids, labels = torch.randint(0, 128, (4, 32), generator=g), torch.randint(0, 128, (4, 32), generator=g)

    def loss_fn(out, target):
        return F.cross_entropy(out.logits.flatten(0, 1).float(), target.flatten(0, 1))
    print(f"Part 1b: {spec} {overrides}, local batch 4x32, AdamW, 3 steps, each stage's first rank, the fake backend")
    print("| configuration | schedule | micro-batches | mixed precision | rank | measured (B) | predicted (B) | "
          "error |")
    print("|---|---|---:|---|---:|---:|---:|---:|")
    errors = []
    for kw in STAGE_CASES:
        config = ParallelConfig(**kw)
        rep = ls.parallel(build_model(spec, "meta", overrides, "causal-lm").model, ids, config=config, device="cpu",
                          backend="fake", steps=3, loss_fn=loss_fn, target=labels)
        for rank in range(0, config.world, config.world // config.pp):
            measured = measure_stage_rank(lambda: build_model(spec, "cpu", overrides, "causal-lm").model, config,
                                          rank, ids, labels, steps=3).peak_bytes
            pred = rep.plan.ranks[rank].peak_bytes
            errors.append(pred / measured - 1)
            mp = config.mixed_precision + (" (autocast)" if config.mixed_precision == "bf16" and config.dp == 1 else "")
            print(f"| {config.label()} | {config.schedule} | {config.microbatches} | {mp} | {rank} | {measured:,} | "
                  f"{pred:,} | {pred / measured - 1:+.2%} |", flush=True)
    print(f"\nerrors from {min(errors):+.2%} to {max(errors):+.2%}; {sum(abs(e) <= 0.05 for e in errors)} of "
          f"{len(errors)} within 5%\n")


INTERLEAVED_CASES = [(LLAMA, dict(gpus=2, fsdp=1)), (LLAMA, dict(gpus=2, fsdp=1, mixed_precision="bf16")),
                     (LLAMA, dict(gpus=4)), (LLAMA, dict(gpus=4, mixed_precision="bf16", ac="full")),
                     (GPT2, dict(gpus=2, fsdp=1)), (GPT2, dict(gpus=4, mixed_precision="bf16"))]


def interleaved_part(schedules=("interleaved",)) -> None:
    """Part 2b: interleaved 1F1B (or the zero-bubble schedules) under torchrun against the prediction's band."""
    from layerscope.planning.real.sharded_run import make_batch
    print("| model | schedule | fsdp | mixed precision | ac | loss rel diff | grad rel diff | measured per rank (B) | "
          "outside the band |")
    print("|---|---|---:|---|---|---:|---:|---|---|")
    for schedule, ((spec, over), kw) in ((s, c) for s in schedules for c in INTERLEAVED_CASES):
        over = {**over, ("n_layer" if "n_layer" in over else "num_hidden_layers"): 4}
        if schedule in ("zb", "zbv"):
            kw = {**kw, "reshard_after_forward": False}     # torch's zero bubble needs it with FSDP (options.py)
        config = ParallelConfig(pp=2, schedule=schedule, microbatches=4, **{"mixed_precision": "off", **kw})
        batch = 4 * config.dp
        real = launch_parallel(spec, config, input_ids=(batch, 16), steps=4, overrides=over, timeout=240)
        ids, labels = make_batch(over["vocab_size"], batch, 16, 1)      # the run's batch (seed 0 + 1)

        def loss_fn(out, target):
            return F.cross_entropy(out.logits.flatten(0, 1).float(), target.flatten(0, 1))
        rep = ls.parallel(build_model(spec, "meta", over, "causal-lm").model, ids[:4], config=config, device="cpu",
                          steps=2, loss_fn=loss_fn, target=labels[:4])
        outside = []
        for w, got in zip(rep.plan.ranks, real.peak_bytes):
            lo, hi = w.simulated_peak_bytes, w.peak_bytes
            outside.append(0.0 if lo <= got <= hi else (got - hi) / hi if got > hi else (got - lo) / lo)
        mp = config.mixed_precision + (" (autocast)" if config.mixed_precision == "bf16" and config.dp == 1 else "")
        name = spec.removeprefix('hf:').removesuffix('Config')
        print(f"| {name} | {schedule} | {config.fsdp} | {mp} | {config.ac} | "
              f"{real.max_rel_loss_diff:.1e} | {real.max_rel_grad_diff:.1e} | "
              f"{', '.join(f'{p:,}' for p in real.peak_bytes)} | {', '.join(f'{o:+.2%}' for o in outside)} |",
              flush=True)


def main() -> None:
    spec, overrides = GPT2 if "--gpt2" in sys.argv else LLAMA
    if "--interleaved" in sys.argv:
        interleaved_part()
        return
    if "--zero-bubble" in sys.argv:
        interleaved_part(("zb", "zbv"))
        return
    if "--stages" in sys.argv:
        stages_part(spec, overrides)
        return
    if "--gloo" not in sys.argv:
        fake_part(spec, overrides)
    if "--fake" in sys.argv:
        return
    print(f"{spec} {overrides}, global batch {BATCH[0]}x{BATCH[1]}, AdamW, 5 steps (3 measured), torch {torch.__version__}")
    print("| ranks | fsdp | tp | pp | ac | mixed precision | loss rel diff | grad rel diff | simulated (B) | gloo late free "
          "(B) | measured per rank (B) | measured / simulated - 1 | outside the band | s |")
    print("|---:|---:|---:|---:|---|---|---:|---:|---:|---:|---|---|---:|---:|")
    worst_all, sim_errors, failed = [], [], []
    for kw in cases("--quick" in sys.argv):
        config = ParallelConfig(**kw)
        t = time.perf_counter()
        try:
            real = launch_parallel(spec, config, input_ids=BATCH, steps=5, overrides=overrides)
        except InputError as e:        # one failed run is a row of its own, not the end of the table
            failed.append(config.label())
            print(f"| {config.world} | {config.fsdp} | {config.tp} | {config.pp} | {config.ac} | "
                  f"{config.mixed_precision} | FAILED: {str(e)[:400]} |", flush=True)
            continue
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
        print(f"| {config.world} | {config.fsdp} | {config.tp} | {config.pp} | {config.ac} | "
              f"{config.mixed_precision} | {real.max_rel_loss_diff:.1e} | {real.max_rel_grad_diff:.1e} | "
              f"{'/'.join(f'{v:,}' for v in sorted(sims))} | "
              f"{'/'.join(f'{v:,}' for v in sorted(lates))} | {', '.join(f'{m:,}' for m in real.peak_bytes)} | "
              f"{', '.join(f'{e:+.1%}' for e in errs)} | {outside:.1%} | {time.perf_counter() - t:.0f} |", flush=True)
    within = sum(abs(e) <= 0.05 for e in sim_errors)
    print(f"\n{sum(e <= 0.05 for e in worst_all)} of {len(worst_all)} configurations: every rank within 5% of the band "
          f"[simulated, simulated + gloo late free]; {within} of {len(sim_errors)} ranks within 5% of the simulation "
          f"alone (measured / simulated - 1 from {min(sim_errors):+.1%} to {max(sim_errors):+.1%})"
          + (f"; {len(failed)} run(s) failed: {', '.join(failed)}" if failed else ""))


if __name__ == "__main__":
    main()
