"""Pipeline runs under torchrun (gloo, CPU): loss vs one process, per-rank peak memory vs the plan.

GPT-2 (transformers' GPT2Config shrunk: 4 layers, width 64, vocabulary 1000; no download) and the
bundled small CNN on 2 processes (dropout off, so the losses are comparable): GPipe and 1F1B with 2
stages, interleaved 1F1B and zero bubble (zb, zbv) with 4 stages (2 per rank), each with torch's default
``schedule.step(..., return_outputs=True)`` (the last stage keeps every micro-batch's output) and
with ``return_outputs=False``; AdamW, 4 micro-batches of 2, 3 steps. The measured peak is the
rank's live tensor bytes in the last step (CPU allocator events) plus what exists before it and the
plan counts (parameters, buffers, the batch on rank 0, the targets on the last rank).

Run: python bench/bench_pipeline.py [--quick | --zero-bubble] [--gpt2 | --large]
  (--quick: 1F1B and interleaved only; --zero-bubble: zb and zbv only; --gpt2: GPT-2 only; --large:
  bench_split.py's GPT-2 instead, 6 layers, width 128, vocabulary 8,000 with its LM head, a batch of 16)
"""
import sys
import time

from layerscope.torchrun import launch

GPT2 = ("hf:GPT2Config", {"n_layer": 4, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 64,
                          "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})  # dropout off: same losses
CNN = ("layerscope.examples:small_cnn", {})
SCHEDULES = [("gpipe", 2), ("1f1b", 2), ("interleaved", 4), ("zb", 4), ("zbv", 4)]
if "--quick" in sys.argv:
    SCHEDULES = SCHEDULES[1:3]
if "--zero-bubble" in sys.argv:
    SCHEDULES = SCHEDULES[3:]
LARGE = ("hf:GPT2Config", {"n_layer": 6, "n_embd": 128, "n_head": 4, "vocab_size": 8000, "n_positions": 128,
                           "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0, "bos_token_id": 0,
                           "eos_token_id": 0})
MODELS = (LARGE,) if "--large" in sys.argv else (GPT2,) if "--gpt2" in sys.argv else (GPT2, CNN)
CASES = [(m, sched, k, keep) for m in MODELS for sched, k in SCHEDULES for keep in (True, False)]

print("| model | schedule | stages | return_outputs | path | loss rel diff | grad rel diff "
      "| per rank: measured / predicted (error) | s |")
print("|---|---|---|---|---|---|---|---|---|")
for (spec, overrides), sched, k, keep in CASES:
    name = spec.split(":")[1]
    t = time.perf_counter()
    try:
        large = overrides is LARGE[1]
        r = launch(spec, overrides=overrides, stages=k, schedule=sched, microbatches=4, batch_size=16 if large else 8,
                   head="causal-lm" if large else None,
                   steps=3, optimizer="adamw", return_outputs=keep, compare_grads=True)
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"| {name} | {sched} | {k} | {keep} | error: {str(e).splitlines()[-1][:100]} | | | | |")
        continue
    mem = ", ".join(f"{x['peak_bytes']:,} / {x['predicted_bytes']:,} B "
                    f"({100 * (x['predicted_bytes'] - x['peak_bytes']) / x['peak_bytes']:+.1f}%)" for x in r.ranks)
    print(f"| {name} | {sched} | {k} | {keep} | {r.path} | {r.loss_rel_diff:.1e} | {r.grad_rel_diff:.1e} | {mem} | "
          f"{time.perf_counter() - t:.1f} |", flush=True)
