"""Real sharded-training runs under torchrun (``launch_parallel``): the configuration's ranks on this
machine's CPU with gloo, every rank building the model from the spec (``specs.build_model``, same
seed), ``parallel.real.run_rank`` doing the rank's work; the same training in one process here,
compared with the ranks' losses and first-step gradients."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import subprocess
import sys
import tempfile

import torch

from ..errors import InputError
from ..options import dtype_short
from ..planning.config import ParallelConfig
from ..planning.real.sharded_run import (GRADS, OPTIMIZERS, STDERR_LOG, make_batch, reference_run, run_rank)
from ..planning.real.torch_stages import PIPELINE_SCHEDULES
from ..planning.simulate.results import ParallelRunResult
from ..planning.real.procs import _free_port, _worker_error, run_torchrun

__all__ = ["launch_parallel", "parallel_worker", "BF16_LOSS_RTOL", "FP32_LOSS_RTOL"]

# the losses' tolerance against one process in fp32: sums over ranks reduce in another order
FP32_LOSS_RTOL = 1e-5
# with bf16 parameters (FSDP's MixedPrecisionPolicy) or autocast against an fp32 reference: bf16
# keeps 8 significant bits (unit roundoff 2^-9 ~ 2e-3 per rounding); 1e-2 allows about five such
# roundings to add up in the loss. Measured: 8.7e-5 on a shrunk 2-layer Llama (FSDP 2, 3 AdamW steps)
BF16_LOSS_RTOL = 1e-2


# what a rendezvous or a gloo connection that lost a race for a port says, and a rank's abort that a run
# again does not meet: the run is tried again
_RUN_AGAIN = ("Address already in use", "EADDRINUSE", "Connection refused", "Connection reset",
              "DistNetworkError", "Broken pipe", "Connection closed by peer", "Socket Timeout",
              # a rank aborted by a joinable std::thread destroyed (a gloo worker, seen 3 times in
              # hundreds of TP runs on this 2-core machine, never twice in a row)
              "terminate called without an active exception")


def _build(spec: str, overrides: dict, model_dtype: str | None, head: str | None):
    from ..specs import build_model
    return build_model(spec, "cpu", overrides or {}, head, dtype=model_dtype).model


def _config_dict(config: ParallelConfig) -> dict:
    d = dataclasses.asdict(config)
    for k in ("reduce_dtype", "model_dtype"):
        d[k] = dtype_short(d[k])
    return d


def _config_of(d: dict) -> ParallelConfig:
    return ParallelConfig(**d)


def _one_line(text: str) -> str:
    """The ranks' errors on one line, each message once with the ranks that raised it."""
    import re
    by: dict[str, list[str]] = {}
    for line in text.splitlines():
        m = re.match(r"rank (\d+): (.*)", line)
        rank, msg = (m.group(1), m.group(2)) if m else (None, line.strip())
        if msg:
            by.setdefault(msg, []).append(rank)
    return "; ".join((f"rank{'s' if len(r) > 1 else ''} {', '.join(sorted(x for x in r if x))}: " if any(r) else "")
                     + msg for msg, r in by.items())


def parallel_worker(cfg: dict) -> None:
    """One rank (``python -m layerscope.torchrun CFG`` with "kind": "parallel")."""
    config = _config_of(cfg["config"])
    run_rank(lambda: _build(cfg["spec"], cfg["overrides"], cfg["model_dtype"], cfg["head"]), config,
             batch=cfg["batch"], seq=cfg["seq"], steps=cfg["steps"], optimizer=cfg["optimizer"], lr=cfg["lr"],
             seed=cfg["seed"], out_dir=cfg["out"])


def launch_parallel(spec: str, config: ParallelConfig, *, input_ids: tuple[int, int] = (4, 16), steps: int = 4,
                    optimizer: str = "adamw", lr: float = 1e-3, seed: int = 0, overrides: dict | None = None,
                    head: str | None = "causal-lm", timeout: float = 300.0) -> ParallelRunResult:
    """Train ``steps`` steps of the model ``spec`` names (``overrides``: its config keys, e.g. a
    shrunk ``hf:LlamaConfig``; ``head``: the transformers head, causal-lm unless told, None for a
    spec that builds its own) under ``config`` with torchrun (gloo, one process per rank, this
    machine's CPU) on a global batch of ``input_ids`` = (batch, sequence) token ids, and the same in
    one process; compare losses (``ParallelRunResult.loss_equal``) and step 1's gradients."""
    batch, seq = _checked(config, input_ids, steps, optimizer)
    model_dtype = None if config.model_dtype == torch.float32 else dtype_short(config.model_dtype)   # fp32: as built
    procs = config.world
    with tempfile.TemporaryDirectory(prefix="layerscope-parallel-") as tmp:
        cfg_path = os.path.join(tmp, "run.json")
        cfg = {"kind": "parallel", "spec": spec, "overrides": overrides or {}, "model_dtype": model_dtype, "head": head,
               "config": _config_dict(config), "batch": batch, "seq": seq, "steps": steps,
               "optimizer": optimizer, "lr": lr, "seed": seed, "out": tmp}
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        ref, ref_grads = _reference(cfg, procs)
        ranks = _run_ranks(cfg_path, tmp, config, procs, timeout)
        grads: dict = {}
        for path in sorted(glob.glob(os.path.join(tmp, f"rank*.{GRADS}"))):     # one rank of each stage
            grads.update(torch.load(path))
    diff = _grad_diff(ref_grads, grads)
    rtol = BF16_LOSS_RTOL if config.mixed_precision == "bf16" else FP32_LOSS_RTOL
    return ParallelRunResult(config=config, ranks=tuple(ranks), losses=tuple(ranks[0]["losses"]),
                             reference_losses=tuple(ref), loss_rtol=rtol, max_rel_grad_diff=diff)


def _checked(config: ParallelConfig, input_ids, steps: int, optimizer: str) -> tuple[int, int]:
    """The global batch's (batch, sequence); what a run cannot take -> InputError."""
    if not isinstance(config, ParallelConfig):
        raise InputError(f"launch_parallel takes a ParallelConfig, got {type(config).__name__}")
    if config.pp > 1 and config.accumulation > 1:
        # one schedule step per optimizer step: its micro-batches are the accumulation
        raise InputError("a pipeline run accumulates over its micro-batches: give --microbatches, not --accumulation")
    if config.pp > 1 and config.schedule not in PIPELINE_SCHEDULES:
        raise InputError(f"a pipeline run takes --schedule {', '.join(PIPELINE_SCHEDULES)}, not {config.schedule}")
    if optimizer not in OPTIMIZERS:
        raise InputError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {optimizer!r}")
    if not isinstance(steps, int) or steps < 3:
        raise InputError(f"steps must be at least 3 (the first two are not measured: the first's gradients are "
                         f"gathered for the comparison, the second warms up), got {steps!r}")
    try:
        batch, seq = (int(x) for x in input_ids)
    except (TypeError, ValueError):
        raise InputError(f"input_ids must be (batch, sequence), got {input_ids!r}") from None
    per = config.dp * config.accumulation
    if batch < per or batch % per:
        raise InputError(f"the global batch ({batch}) must split evenly into data-parallel degree {config.dp} x "
                         f"accumulation {config.accumulation}")
    if config.local_batch is not None and config.local_batch * per != batch:
        raise InputError(f"local_batch {config.local_batch} x dp {config.dp} x accumulation {config.accumulation} "
                         f"!= the global batch {batch}")
    return batch, seq


def _reference(cfg: dict, procs: int):
    """One process's (losses, first gradients) of the run ``cfg`` describes, run first with the
    threads of one rank: a model the spec cannot build fails here in one line."""
    spec, seed, steps = cfg["spec"], cfg["seed"], cfg["steps"]
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // procs))
    try:
        torch.manual_seed(seed)
        model = _build(spec, cfg["overrides"], cfg["model_dtype"], cfg["head"])
        vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
        if vocab < 1:
            raise InputError(f"{spec}: the model has no config.vocab_size to draw token ids from")
        ids, labels = make_batch(vocab, cfg["batch"], cfg["seq"], seed + 1)
        ref, ref_grads = reference_run(model, ids, labels, steps=steps, optimizer=cfg["optimizer"], lr=cfg["lr"])
        del model
    finally:
        torch.set_num_threads(threads)
    return ref, ref_grads


def _run_ranks(cfg_path: str, tmp: str, config: ParallelConfig, procs: int, timeout: float) -> list[dict]:
    """torchrun's ``procs`` ranks on ``cfg_path``: what each wrote; a failed run -> InputError."""
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // procs)))
    for attempt in range(3):
        # the port is free when chosen, not always when torchrun binds it (another process, or a
        # gloo connection of the run before, may take it in between): a rendezvous that fails on
        # the network is tried again on another port
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs),
               "--master_port", str(_free_port()), "-m", "layerscope.torchrun", cfg_path]
        try:
            proc = run_torchrun(cmd, timeout, env)
        except subprocess.TimeoutExpired:
            raise InputError(f"the parallel run ({config.label()}) did not finish in {timeout:g} s") from None
        text = proc.stderr or proc.stdout or ""
        if proc.returncode == 0 or not any(m in text for m in _RUN_AGAIN):
            break
    if proc.returncode != 0:
        raise InputError(f"the parallel run ({config.label()}) failed (torchrun exit {proc.returncode}): "
                         + _one_line(_worker_error((proc.stderr or proc.stdout or "") + _measured_stderr(tmp))))
    ranks = []
    for r in range(procs):
        with open(os.path.join(tmp, f"rank{r}.json")) as f:
            ranks.append(json.load(f))
    return ranks


def _grad_diff(ref_grads: dict, grads: dict) -> float:
    """The largest relative difference of the run's first gradients from one process's; a
    parameter the run returned no gradient for -> InputError."""
    diff = 0.0
    missing = sorted(set(ref_grads) - set(grads))
    if missing:
        raise InputError(f"the run returned no gradients for {missing[:5]}")
    for name, want in ref_grads.items():
        want = want.double()
        diff = max(diff, float((grads[name].double() - want).norm()) / (float(want.norm()) or 1.0))
    return diff


def _measured_stderr(out_dir: str) -> str:
    """What a rank that died while its steps were measured wrote to stderr meanwhile (its file of the
    allocator's count, less the count's own lines), each line marked with its rank as torchrun does."""
    from ..capture.measure import read_counted
    lines = []
    for path in sorted(glob.glob(os.path.join(out_dir, f"rank*.{STDERR_LOG}"))):
        rank = os.path.basename(path).split(".")[0]
        with open(path, "rb") as f:
            _, rest = read_counted(f, 0)
        lines += [text if text.startswith(f"[{rank}]") else f"[{rank}]: {text}" for text in map(str.rstrip, rest)]
    return "\n" + "\n".join(lines) if lines else ""
