"""One search candidate of Llama-2-70B on 64 fake H100 ranks (tp 4 x fsdp 16, full checkpointing, local batch 4
of 4,096 tokens, no resharding, bf16, AdamW, 2 steps) evaluated as the search evaluates it
(planning/search/copies.py ``_Evaluator.__call__``): on the two shrunk copies extended linearly (before), and
composed from five blocks of the whole model (after, planning/simulate/composed_rank.py), interleaved A B A B
in one process, and composed once more with the plain model's loop check kept from the composed run before it (a
search's later candidates of the same inputs: WorldRun.checks). Prints wall and CPU seconds of each, the load average, and every figure of the two plans side
by side (docs/benchmarks.md, "A sharded rank composed from its blocks"). ``--whole`` also simulates the rank
whole once, the reference the composed figures must equal. Run by hand: python bench/bench_composed_rank.py"""

import os
import sys
import time

import torch

from layerscope.capture.attention import resolve_gpu, router_for
from layerscope.options import optimizer_factory
from layerscope.planning.config import ParallelConfig
from layerscope.planning.search import bounds
from layerscope.planning.search.copies import _Evaluator
from layerscope.planning.simulate.world import WorldRun, simulate_world
from layerscope.planning.steptime.sharded_time import FRACTIONS

H100 = resolve_gpu("H100")
SEQ = 4096


def _llama70b():
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=8192, intermediate_size=28672, num_attention_heads=64, num_key_value_heads=8,
                      num_hidden_layers=80, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
                      use_cache=False)
    with torch.device("meta"):
        return LlamaForCausalLM(cfg)


def _world(compose, checks=None):
    return WorldRun(optimizer_factory("adamw"), 2, None, True, "nccl",
                    lambda: router_for(H100, "auto", simulated=True, cuda_target=True, autocast_device="cpu"),
                    compose=compose, checks=checks)


def _evaluator(model, args, composed: bool, checks=None):
    plain = _world(False)

    def simulate(m, a, k, c):
        return simulate_world(m, a, k, c, plain)
    if composed:
        # as the search's: one loop check per input shape (a fresh one per evaluator, or ``checks``: those a
        # search's earlier candidate of the same inputs found)
        only = _world("only", {} if checks is None else checks)
        simulate.composed = lambda m, a, k, c: simulate_world(m, a, k, c, only)
    return _Evaluator(model, args, {}, batch0=1, simulate=simulate, gpu=H100, limit=80 * 10**9, fracs=FRACTIONS,
                      tokens_of=lambda c: 64 * SEQ)


class _Scan:
    """The block figures' lookup before bounds._BlockOf (6cf53bf): a scan of every block path per record."""

    def __init__(self, blocks):
        self.blocks = blocks

    def __call__(self, path):
        return bounds._in_block(path, self.blocks)


def _timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def _figures(plan):
    r = max(plan.ranks, key=lambda x: x.peak_bytes)
    return {"peak_bytes": plan.peak_bytes, "peak_phase": getattr(r, "peak_phase", None),
            "peak_layer": r.peak_layer, "breakdown": dict(r.breakdown),
            "collectives": [(x.kind, x.calls, x.bytes_read, x.bytes_written) for x in r.collectives],
            "step_time": plan.step_time}


def main() -> None:
    model = _llama70b()
    args = (torch.zeros(1, SEQ, dtype=torch.long, device="meta"),)
    c = ParallelConfig(gpus=64, tp=4, fsdp=16, ac="full", local_batch=4, reshard_after_forward=False)
    out = {}
    for rnd in range(2):
        checks = {}
        # "composed, check kept": a later candidate of a search, the loop check found by an earlier one
        # "composed, scan": as 6cf53bf (the block figures' scan of every block path), interleaved with after
        for name in ("copies", "composed, scan", "composed", "composed, check kept"):
            ev = _evaluator(model, args, name != "copies", checks if name in ("composed", "composed, check kept")
                            else None)
            fast, bounds._BlockOf = bounds._BlockOf, (_Scan if name == "composed, scan" else bounds._BlockOf)
            try:
                plan, wall, cpu = _timed(lambda: ev(c))
            finally:
                bounds._BlockOf = fast
            print(f"round {rnd} {name}: wall {wall:.1f} s, CPU {cpu:.1f} s, load {os.getloadavg()[0]:.2f}, "
                  f"used {getattr(ev, 'used', None)}", flush=True)
            out[name] = plan
    kept = [_figures(out[k]) for k in ("composed, scan", "composed, check kept")]
    print(f"every composed arm's figures equal: {all(x == _figures(out['composed']) for x in kept)}", flush=True)
    a, b = _figures(out["copies"]), _figures(out["composed"])
    for k in a:
        print(f"{k}: copies {a[k]}\n{' ' * len(k)}  composed {b[k]}", flush=True)
    if "--whole" in sys.argv:
        ids = torch.zeros(4, SEQ, dtype=torch.long, device="meta")
        (ranks, *_), wall, cpu = _timed(lambda: simulate_world(model, (ids,), {}, c, _world(False)))
        comp = out["composed"].ranks
        same = tuple(ranks) == tuple(comp)
        print(f"whole: wall {wall:.1f} s, CPU {cpu:.1f} s; composed ranks equal to the whole's: {same}", flush=True)


if __name__ == "__main__":
    main()
