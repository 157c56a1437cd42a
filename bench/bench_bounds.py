"""The search's lower bounds (planning/search/bounds.py) against the whole simulation of each configuration
they stand for: a transformers Llama of 8 layers (width 512, 256 tokens, vocabulary 8,000) on fake
ranks, eight pipelines (1F1B and interleaved, FSDP, HSDP, TP, checkpointing, resharding) and eight
configurations without one (the same, with gradient accumulation). Prints each peak and predicted step
beside its bounds, and their ratios (docs/benchmarks.md, "Pipelines ruled out by lower bounds" and the
section after it). Run by hand: python bench/bench_bounds.py (about 3 minutes)."""

import time

import torch

from layerscope.capture.attention import resolve_gpu, router_for
from layerscope.options import optimizer_factory
from layerscope.planning.config import ParallelConfig
from layerscope.planning.blocks import find_blocks
from layerscope.planning.search.bounds import block_figures, pipeline_bounds, proxy_config, stage_numels
from layerscope.planning.simulate.results import ESTIMATES
from layerscope.planning.search.space import _shrunk
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
                            one_role=len(groups) == 1)
        b = pipeline_bounds(c, fig, stage_numels(model, c.stages), 8, FRACTIONS)
        bound = time.perf_counter() - t
        print(f"{c.label()}, {m} x {mbs}{', resharded' if reshard else ''}: peak {peak / 2**20:.2f} MiB, bound "
              f"{b.peak_bytes / peak:.3f}; step {step * 1e3:.1f} ms, bound {b.step_time / step:.3f} "
              f"(whole {whole:.1f} s, bounds {bound:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
