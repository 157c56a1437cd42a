"""Pipeline runs under torchrun (gloo, CPU): loss vs one process, per-stage peak memory vs the plan.

Run: python bench/bench_pipeline.py
"""
import time

from layerscope.pipeline.run import launch

CASES = [(spec, k, sched) for spec in ("layerscope.examples:tiny_gpt", "layerscope.examples:small_cnn")
         for k in (2, 4) for sched in ("gpipe", "1f1b")]

print("| model | procs | schedule | path | loss rel diff | peak measured / predicted per stage | s |")
print("|---|---|---|---|---|---|---|")
for spec, k, sched in CASES:
    t = time.perf_counter()
    try:
        r = launch(spec, stages=k, schedule=sched, microbatches=4, batch_size=8, steps=3, optimizer="adamw")
    except Exception as e:  # noqa: BLE001 - report and go on
        print(f"| {spec.split(':')[1]} | {k} | {sched} | error: {str(e).splitlines()[0][:80]} | | | |")
        continue
    mem = ", ".join(f"{x['peak_bytes'] / 2**20:.2f}/{x['predicted_bytes'] / 2**20:.2f} MiB "
                    f"({100 * (x['predicted_bytes'] - x['peak_bytes']) / x['peak_bytes']:+.0f}%)" for x in r.ranks)
    print(f"| {spec.split(':')[1]} | {k} | {sched} | {r.path} | {r.loss_rel_diff:.1e} | {mem} | "
          f"{time.perf_counter() - t:.1f} |", flush=True)
