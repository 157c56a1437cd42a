"""The search's lower bounds (planning/search/bounds.py) against the whole simulation of each configuration
they stand for: a transformers Llama of 8 layers (width 512, 256 tokens, vocabulary 8,000) on fake
ranks, eight pipelines (1F1B and interleaved, FSDP, HSDP, TP, checkpointing, resharding) and eight
configurations without one (the same, with gradient accumulation). Prints each peak and predicted step
beside its bounds, and their ratios (docs/benchmarks.md, "Pipelines ruled out by lower bounds" and the
section after it). Run by hand: python bench/bench_bounds.py (about 3 minutes on a quiet machine).

``--70b``: Llama-2-70B on 64 fake H100 ranks (`--input-ids 1,4096`, global batch 64, the model's own loss),
two pipelines and five configurations without one (docs/benchmarks.md; the first of them the search's
answer), each as the search has it
(planning/search/copies.py): its bounds first, from a fresh evaluator's two-block copies (micro-batches 1
and 2, larger ones by their line), then the configuration simulated on copies of 3 and 4 blocks a stage
and extended. A few minutes each. ``--70b --cp``: three context-parallel configurations instead."""

import os
import sys
import time

import torch

from layerscope.capture.attention import resolve_gpu, router_for
from layerscope.options import optimizer_factory
from layerscope.planning.config import ParallelConfig
from layerscope.planning.blocks import find_blocks
from layerscope.planning.search.bounds import (block_figures, least_block, one_role, outer_paths, pipeline_bounds,
                                              proxy_config, regathered, stage_numels)
from layerscope.planning.simulate.results import ESTIMATES
from layerscope.planning.search.copies import _shrunk
from layerscope.planning.steptime.sharded_time import FRACTIONS, step_time
from layerscope.planning.simulate.world import WorldRun, simulate_world

H100 = resolve_gpu("H100")
CONFIGS = [  # tp, pp, fsdp, replicate, ac, schedule, micro-batch size, micro-batches, reshard after forward
    (2, 2, 2, 1, "none", "1f1b", 2, 4, False), (2, 2, 2, 1, "full", "1f1b", 2, 4, False),
    (2, 2, 2, 1, "selective-op", "1f1b", 1, 4, True), (1, 4, 2, 1, "none", "1f1b", 1, 4, False),
    (2, 2, 2, 1, "none", "interleaved", 1, 4, False), (2, 2, 2, 1, "full", "interleaved", 2, 2, True),
    (2, 4, 1, 1, "none", "1f1b", 1, 8, False), (1, 2, 2, 2, "none", "1f1b", 2, 2, False),
    # without a pipeline: the micro-batches are gradient accumulation's micro-steps
    (2, 1, 1, 1, "none", "1f1b", 4, 1, False), (1, 1, 2, 1, "none", "1f1b", 2, 1, False),
    (2, 1, 2, 1, "full", "1f1b", 2, 2, False), (2, 1, 2, 1, "selective-op", "1f1b", 1, 4, True),
    (1, 1, 2, 2, "none", "1f1b", 2, 1, False), (4, 1, 2, 1, "none", "1f1b", 2, 1, True),
    (2, 1, 1, 2, "full", "1f1b", 2, 1, False), (2, 1, 1, 1, "selective-op", "1f1b", 2, 3, False)]


def simulate(model, batch, c):
    ids = torch.zeros(batch, 256, dtype=torch.long, device="meta")
    return simulate_world(model, (ids,), {}, c, WorldRun(
        optimizer_factory("adamw"), 2, None, True, "nccl",
        lambda: router_for(H100, "auto", simulated=True, cuda_target=True, autocast_device="cpu")))


def main() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(hidden_size=512, intermediate_size=1376, num_attention_heads=8, num_key_value_heads=8,
                      num_hidden_layers=8, vocab_size=8000, max_position_embeddings=512)
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    small = _shrunk(model, 2)
    paths = [p for p, _ in find_blocks(small)]
    for tp, pp, fsdp, rep, ac, schedule, mbs, m, reshard in CONFIGS:
        batches = dict(microbatches=m, local_batch=mbs * m) if pp > 1 else dict(accumulation=m, local_batch=mbs)
        c = ParallelConfig(gpus=tp * pp * fsdp * rep, tp=tp, pp=pp, fsdp=fsdp, replicate=rep, ac=ac,
                           schedule=schedule, reshard_after_forward=reshard, **batches)
        t = time.perf_counter()
        ranks, _, _, _, runs = simulate(model, c.local_batch, c)
        whole = time.perf_counter() - t
        peak = max(r.peak_bytes for r in ranks)
        step = step_time(runs, c, H100, tokens=None, f=FRACTIONS).step_time
        t = time.perf_counter()
        q = proxy_config(c, mbs)
        qranks, _, groups, _, qruns = simulate(small, mbs, q)
        fig = block_figures(qruns[0], q, H100, FRACTIONS, paths, nccl=qranks[0].breakdown[ESTIMATES[0]] > 0,
                            one_role=one_role(groups, q), outer=outer_paths(small, paths))
        b = pipeline_bounds(c, fig, stage_numels(model, c.stages), 8, FRACTIONS, gpu=H100,
                            regathered=regathered(model), block=least_block(model))
        bound = time.perf_counter() - t
        print(f"{c.label()}, {m} x {mbs}{', resharded' if reshard else ''}: peak {peak / 2**20:.2f} MiB, bound "
              f"{b.peak_bytes / peak:.3f}; step {step * 1e3:.1f} ms, bound {b.step_time / step:.3f} "
              f"(whole {whole:.1f} s, bounds {bound:.1f} s)", flush=True)


LLAMA_70B = [  # tp, pp, fsdp, replicate, ac, schedule, micro-batch size, micro-batches (accumulation), reshard
    (8, 2, 4, 1, "full", "1f1b", 8, 2, False), (4, 2, 8, 1, "none", "1f1b", 1, 8, False),
    (4, 1, 16, 1, "full", "1f1b", 4, 1, False), (4, 1, 16, 1, "full", "1f1b", 1, 4, False),
    (8, 1, 8, 1, "selective-op", "1f1b", 4, 2, False),
    (1, 1, 64, 1, "selective-op", "1f1b", 1, 1, True), (8, 1, 1, 8, "full", "1f1b", 2, 4, False)]
# context parallel (``--cp``): tp, cp, fsdp, ac, micro-batch size, accumulation, reshard after forward
LLAMA_70B_CP = [(1, 2, 32, "none", 1, 2, True), (1, 8, 8, "none", 2, 4, True), (4, 2, 8, "full", 2, 2, False)]


def main_70b(rows=None) -> None:
    from layerscope.capture.loss import choose_loss
    from layerscope.planning.search.copies import _Evaluator
    from layerscope.specs import build_model, command_inputs
    model = build_model("hf:llama-2-70b", device="meta").model
    args, kwargs = command_inputs("hf:llama-2-70b", model, None, torch.device("meta"), input_ids=(1, 4096))
    world = WorldRun(optimizer_factory("adamw"), 2, choose_loss(model, args, kwargs, "auto"), True, "nccl",
                     lambda: router_for(H100, "auto", simulated=True, cuda_target=True, autocast_device="cpu"))
    if rows is None and "--cp" in sys.argv[1:]:
        rows = [(tp, 1, fsdp, 1, ac, "1f1b", mbs, m, reshard, cp) for tp, cp, fsdp, ac, mbs, m, reshard in LLAMA_70B_CP]
    for tp, pp, fsdp, rep, ac, schedule, mbs, m, reshard, *more in (rows or LLAMA_70B):
        cp = more[0] if more else 1
        batches = dict(microbatches=m, local_batch=mbs * m) if pp > 1 else dict(accumulation=m, local_batch=mbs)
        c = ParallelConfig(gpus=64, tp=tp, pp=pp, fsdp=fsdp, replicate=rep, cp=cp, ac=ac, schedule=schedule,
                           reshard_after_forward=reshard, global_batch=64, **batches)
        ev = _Evaluator(model, args, kwargs, batch0=1, simulate=lambda md, a, k, cf: simulate_world(md, a, k, cf, world),
                        gpu=H100, limit=H100.memory, fracs=FRACTIONS, tokens_of=lambda c: 64 * 4096)
        t, cpu = time.perf_counter(), time.process_time()
        b = ev.bounds(c)
        bound, bound_cpu = time.perf_counter() - t, time.process_time() - cpu
        t, cpu = time.perf_counter(), time.process_time()
        plan = ev(c)
        whole, whole_cpu = time.perf_counter() - t, time.process_time() - cpu
        print(f"{c.label()}, {m} x {mbs}{', resharded' if reshard else ''}: peak {plan.peak_bytes / 2**30:.2f} GiB, "
              f"bound {b.peak_bytes / 2**30:.2f} ({b.peak_bytes / plan.peak_bytes:.3f}); step "
              f"{plan.step_time * 1e3:,.0f} ms, bound {b.step_time * 1e3:,.0f} ({b.step_time / plan.step_time:.3f}) "
              f"(bounds {bound:.1f} s wall / {bound_cpu:.1f} s CPU, whole {whole:.1f} / {whole_cpu:.1f} s; "
              f"load {os.getloadavg()[0]:.1f})", flush=True)


if __name__ == "__main__":
    main_70b() if "--70b" in sys.argv[1:] else main()
