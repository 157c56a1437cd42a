"""Derived tensor-parallel plans trained for real: every architecture of the sweep in
tests/planning/sharded/test_tp_derived_real.py (14, and two with full checkpointing), each with
``layerscope parallel hf:<Config> --gpus 4 --tp 2 --device cpu --mixed-precision off --run --steps 3``
(FSDP 2 x TP 2 on 4 gloo ranks, this machine's CPU) against one process training the same model (fp32) and
against the CPU allocator's own count of each rank's blocks (the band of issue 35: from the simulated peak
to it plus gloo's late free).

The suite runs four of them (one dense with q/k norms, one with fused projections, two MoE: the styles
the others reuse); the whole sweep is here, because its 16 torchrun launches take 40-90 s each on 2 cores
and would take CI past its time. Prints one row an architecture: the loss's worst relative difference over
the steps, the first step's gradients', and each rank's peak against the band's low end.

    python bench/bench_tp_derived.py [CONFIG ...]
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))   # the checkout, for tests/
from tests.planning.sharded.test_tp_derived_real import ARCH, BASE, SWEEP  # noqa: E402


def run(cfg_name: str, ac: str) -> dict:
    from layerscope.cli import main
    sets = [x for k, v in {**BASE, **ARCH[cfg_name]}.items() for x in ("--set", f"{k}={v}")]
    argv = ["parallel", f"hf:{cfg_name}", "--head", "causal-lm", *sets, "--input-ids", "4,16", "--gpus", "4",
            "--tp", "2", "--device", "cpu", "--mixed-precision", "off", "--ac", ac, "--run", "--steps", "3", "-q",
            "--format", "json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(argv)
    if rc != 0:
        raise SystemExit(f"{cfg_name}: exit {rc}")
    return json.loads(out.getvalue())["plans"][0]


def main() -> None:
    only = set(sys.argv[1:])
    print(f"{'architecture':<26} {'loss rel':>9} {'grad rel':>9}  rank peaks vs the band's low end")
    for cfg_name, ac in SWEEP:
        if only and cfg_name not in only:
            continue
        plan = run(cfg_name, ac)
        m = plan["measured"]
        peaks = [f"{(got['peak_bytes'] / want['simulated_peak_bytes'] - 1) * 100:+.2f}%"
                 for want, got in zip(plan["ranks"], m["ranks"])]
        name = cfg_name + (f" ac {ac}" if ac != "none" else "")
        print(f"{name:<26} {m['max_rel_loss_diff']:>9.1e} {m['max_rel_grad_diff']:>9.1e}  {' '.join(peaks)}",
              flush=True)


if __name__ == "__main__":
    main()
