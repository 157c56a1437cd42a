"""Pipeline runs under torchrun (gloo, CPU): loss vs one process, per-stage peak memory vs the plan.

GPT-2 (transformers' GPT2Config shrunk: 4 layers, width 64, vocabulary 1000; no download) and the
bundled small CNN, 2 and 4 processes (dropout off, so the losses are comparable), GPipe and 1F1B, AdamW, 4 micro-batches of 2, 3 steps.

Run: python bench/bench_pipeline.py
"""
import time

from layerscope.torchrun import launch

GPT2 = ("hf:GPT2Config", {"n_layer": 4, "n_embd": 64, "n_head": 4, "vocab_size": 1000, "n_positions": 64,
                          "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})  # dropout off: same losses
CNN = ("layerscope.examples:small_cnn", {})
CASES = [(m, k, sched) for m in (GPT2, CNN) for k in (2, 4) for sched in ("gpipe", "1f1b")]

print("| model | procs | schedule | path | loss rel diff | peak measured / predicted per stage | s |")
print("|---|---|---|---|---|---|---|")
for (spec, overrides), k, sched in CASES:
    name = spec.split(":")[1]
    t = time.perf_counter()
    try:
        r = launch(spec, overrides=overrides, stages=k, schedule=sched, microbatches=4, batch_size=8,
                   steps=3, optimizer="adamw")
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"| {name} | {k} | {sched} | error: {str(e).splitlines()[-1][:100]} | | | |")
        continue
    mem = ", ".join(f"{x['peak_bytes'] / 2**20:.2f}/{x['predicted_bytes'] / 2**20:.2f} MiB "
                    f"({100 * (x['predicted_bytes'] - x['peak_bytes']) / x['peak_bytes']:+.0f}%)" for x in r.ranks)
    print(f"| {name} | {k} | {sched} | {r.path} | {r.loss_rel_diff:.1e} | {mem} | "
          f"{time.perf_counter() - t:.1f} |", flush=True)
