"""`layerscope parallel`: per-rank memory of a sharded-training configuration."""

from __future__ import annotations

import argparse

from .common import build_spec, emit, status


def run_parallel(ns: argparse.Namespace) -> int:
    from ..api import parallel
    from ..options import ParallelConfig

    model, args, kwargs = build_spec(ns, "meta")      # the simulation never needs the weights
    config = ParallelConfig(
        gpus=ns.gpus, gpus_per_node=ns.gpus_per_node, fsdp=ns.fsdp, replicate=ns.replicate, tp=ns.tp, pp=ns.pp,
        schedule=ns.schedule, microbatches=ns.microbatches, accumulation=ns.accumulation,
        global_batch=ns.global_batch, ac=ns.ac, mixed_precision=ns.mixed_precision, reduce_dtype=ns.reduce_dtype,
        model_dtype=ns.model_dtype or "fp32", reshard_after_forward=ns.reshard_after_forward, offload=ns.offload)
    with status(f"simulating {config.world} rank(s)", ns):
        rep = parallel(model, *args, config=config, optimizer=ns.optimizer, steps=ns.steps, device=ns.device,
                       gpu=ns.gpu, memory_limit=ns.memory_limit, forward_kwargs=kwargs)
    return emit(ns, rep)
