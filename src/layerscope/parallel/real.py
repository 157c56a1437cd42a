"""One rank of a real sharded-training run under torchrun (gloo on CPU), below the launcher, and the
same training in one process to compare with.

The launcher (``layerscope.torchrun.launch_parallel``) starts ``torchrun -m layerscope.torchrun CFG``;
every rank builds the model from the spec with the same seed (identical weights before sharding),
and hands a factory here. A rank parallelizes it (``apply.parallelize``), takes its data-parallel
slice of the global batch (tensor-parallel ranks the same slice), trains ``steps`` steps and writes
what it measured: its peak memory per step from the CPU allocator's own count of every thread's
blocks (``capture.measure.measure_cpu(threads=True)``: libc10's memory reporter), the loss per step
(averaged over the data-parallel ranks), the first step's gradients as full tensors (rank 0), and
the step times (``steps`` more steps timed without the profiler, whose event buffers slow steps).
"""

from __future__ import annotations

import json
import os
import time
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .. import _compat
from ..errors import InputError
from ..options import ParallelConfig
from .apply import (amp_context, build_mesh, canonical_tensors, data_parallel_rank, loss_context, no_kv_cache,
                    parallelize)

__all__ = ["make_batch", "reference_run", "run_rank", "training_loss", "measure_one_rank", "OPTIMIZERS"]

OPTIMIZERS = ("adamw", "sgd")
# a rank's stderr while its steps are measured (the allocator's count; the launcher reads what else it
# holds when the rank dies)
STDERR_LOG = "stderr.log"


def make_batch(vocab: int, batch: int, seq: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch every rank and the reference build alike: token ids and next-token labels
    (the ids shifted by one, the last label a fresh token), from a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()


def _logits(out):
    logits = getattr(out, "logits", None)
    if logits is None:
        logits = out[0] if isinstance(out, (tuple, list)) else out
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3:
        raise InputError("the model's output has no [batch, sequence, vocabulary] logits to train on")
    return logits


def training_loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the batch's tokens, in fp32 (torchtitan's loss)."""
    logits = _logits(model(ids))
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))


def _optimizer(name: str, params, lr: float):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise InputError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


def reference_run(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, *, steps: int, optimizer: str,
                  lr: float) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the whole global batch, the same loss and optimizer: (loss per step, {name:
    gradient of step 1})."""
    no_kv_cache(model)
    model.train()
    opt = _optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], lr)
    losses, grads = [], {}
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = training_loss(model, ids, labels)
        loss.backward()
        if step == 0:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        opt.step()
        losses.append(loss.item())
    return losses, grads


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def run_rank(build: Callable[[], nn.Module], config: ParallelConfig, *, batch: int, seq: int, steps: int,
             optimizer: str, lr: float, seed: int, out_dir: str) -> None:
    """What one rank does (see the module's doc); writes ``out_dir``/rank<R>.json and, on rank 0,
    grads.pt (step 1's gradients, full tensors named as in the unparallelized model)."""
    import torch.distributed as dist

    from ..capture.measure import count_cpu_allocations, measure_cpu, state_bytes

    # the CPU allocator counts every thread's blocks from here on, before the model and the gloo group
    # exist: gloo's worker threads make buffers and free the step's tensors the profiler never sees
    count_cpu_allocations()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != config.world:
        raise InputError(f"torchrun started {world} ranks, the configuration needs {config.world}")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        torch.manual_seed(seed)                  # same weights on every rank before sharding
        model = build()
        no_kv_cache(model)
        model.train()
        vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
        if vocab < 1:
            raise InputError("the model has no config.vocab_size to draw token ids from")
        ids, labels = make_batch(vocab, batch, seq, seed + 1)
        mesh = build_mesh(config, "cpu")
        parallelize(model, config, mesh)
        dp_rank, acc = data_parallel_rank(config, mesh), config.accumulation
        rows = batch // config.dp
        my_ids, my_labels = ids[dp_rank * rows:(dp_rank + 1) * rows], labels[dp_rank * rows:(dp_rank + 1) * rows]
        chunks = list(zip(my_ids.tensor_split(acc), my_labels.tensor_split(acc)))
        opt = _optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], lr)
        losses: list[float] = []
        times: list[float] = []
        grads: dict = {}

        def one_step(record: bool) -> None:
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            total = torch.zeros(())
            for x, y in chunks:
                with loss_context(config):
                    with amp_context(config, "cpu"):
                        loss = training_loss(model, x, y)
                    (loss / acc).backward()
                total += _local(loss).detach().float() / acc
            opt.step()
            times.append(time.perf_counter() - t0)
            if record:
                # the mean over the data-parallel ranks (tensor-parallel ranks hold the same loss)
                dist.all_reduce(total)
                losses.append(float(total) / world)

        def all_steps(on_step) -> None:
            for i in range(2, steps):
                on_step(i - 2, "begin")
                one_step(True)
                on_step(i - 2, "end")

        # steps 1 and 2 unmeasured. Step 1's gradients are gathered for the comparison (on rank 0 they
        # stay alive, outside what the measured steps hold). Step 2 is a warm-up: measured, it held
        # more than every later step (FSDP 2 on gloo, shrunk Llama, 6-step runs: 1,955 KiB against
        # 1,740-1,744 KiB on both ranks; on the fake backend, in one process, 941 against 913 KiB of
        # growth), which the simulation's second step, already its steady state, does not show. Each
        # measured step starts with the optimizer's state and the last step's gradients alive.
        one_step(True)
        for n, p in model.named_parameters():
            if p.grad is not None:
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                if rank == 0:
                    grads[n] = g.detach().clone()
        one_step(True)
        held = [_local(t) for t in (*model.parameters(), *model.buffers())] + [my_ids, my_labels]
        held += [_local(p.grad) for p in model.parameters() if p.grad is not None]
        held += [_local(t) for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
        before = state_bytes(held)
        # let go of them: this list kept the warm-up's gradients alive through every measured step
        # (zero_grad freed nothing), 180,864 B (every gradient) above the real peak on FSDP 2
        del held
        # every thread's allocations and frees: gloo's worker threads allocate buffers and free the
        # step's tensors (recorded on the step's thread alone, the peaks drifted up step after step)
        measured = measure_cpu(all_steps, before, steps - 2, threads=True,
                               log_path=os.path.join(out_dir, f"rank{rank}.{STDERR_LOG}"))
        times.clear()
        for _ in range(steps):          # timed without the profiler
            one_step(False)
        coords = {}
        if mesh is not None:
            coords = {n: mesh.get_local_rank(n) for n in mesh.mesh_dim_names}
        out = {"rank": rank, "coords": coords, "dp_rank": dp_rank, "peak_bytes": list(measured.step_peaks),
               "before_bytes": before, "times": times, "losses": losses,
               "local_params": sum(_local(p).numel() for p in model.parameters()),
               "batch_rows": int(my_ids.shape[0])}
        if rank == 0:
            torch.save(canonical_tensors(grads), os.path.join(out_dir, "grads.pt"))
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()


def measure_one_rank(build: Callable[[], nn.Module], config: ParallelConfig, rank: int, ids: torch.Tensor,
                     labels: torch.Tensor, *, steps: int = 3, optimizer: str = "adamw", seed: int = 0,
                     device: str = "cpu"):
    """Rank ``rank``'s real training step in this process, its collectives on torch's ``fake`` backend
    (they move no data, so the ranks need not exist): the configuration applied with torch's own code
    to a real model, ``steps`` steps on ``ids``/``labels`` (the rank's local batch), each step's peak
    from the allocator, not layerscope's tracker: on ``device="cpu"`` the CPU allocator's events
    (``capture.measure``), on ``"cuda"`` ``torch.cuda.max_memory_allocated`` (the model moved to the
    current CUDA device; rank 0 is the one a single GPU can play, as the mesh puts rank r on device
    r). What the simulation cannot be checked against this way is the real backend's own buffers and
    threads (gloo's, NCCL's). Returns the ``Measured`` record."""
    from ..capture.measure import measure_cpu, measure_cuda, state_bytes
    from ..capture.storage import cuda_block_size
    from .simulate import fake_world

    if device not in ("cpu", "cuda"):
        raise InputError(f"measure_one_rank runs on cpu or cuda, not {device!r}")
    with fake_world(rank, config.world):
        torch.manual_seed(seed)
        model = build()
        no_kv_cache(model)
        model.train()
        if device == "cuda":
            model.to(torch.cuda.current_device())
            ids, labels = ids.to(torch.cuda.current_device()), labels.to(torch.cuda.current_device())
        parallelize(model, config, build_mesh(config, device))
        opt = _optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], 1e-3)

        def all_steps(on_step) -> None:
            for i in range(steps):
                on_step(i, "begin")
                with loss_context(config), amp_context(config, device):
                    loss = training_loss(model, ids, labels)
                    loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                on_step(i, "end")

        own = [_local(t) for t in (*model.parameters(), *model.buffers())] + [ids, labels]
        if device == "cuda":
            here = torch.device("cuda", torch.cuda.current_device())
            return measure_cuda(all_steps, here, steps, state_bytes(own, here, cuda_block_size))
        return measure_cpu(all_steps, state_bytes(own), steps)


def measure_stage_rank(build: Callable[[], nn.Module], config: ParallelConfig, rank: int, ids: torch.Tensor,
                       labels: torch.Tensor, *, steps: int = 3, optimizer: str = "adamw", seed: int = 0):
    """The pipeline equivalent of ``measure_one_rank`` (``pp`` > 1): rank ``rank``'s stage (the uniform
    split, parallel/stages.py) built from a real model and parallelized on the mesh without ``pp``,
    trained ``steps`` steps by torch's own ``PipelineStage`` and schedule (``ScheduleGPipe`` or
    ``Schedule1F1B``, ``return_outputs=False``) on ``ids``/``labels`` (the rank's local batch, split
    into ``config.microbatches``), its P2P transfers and collectives on torch's ``fake`` backend.
    The loss: ``training_loss``'s cross-entropy on the logits, per micro-batch. Each step's peak from
    the CPU allocator's events. Returns the ``Measured`` record."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    from ..capture.measure import measure_cpu, state_bytes
    from .simulate import fake_world
    from .stages import parallelize_stage, split_micro, stage_module

    schedules = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    if config.schedule not in schedules:
        raise InputError(f"measure_stage_rank runs {', '.join(schedules)}, not {config.schedule}")
    stage = rank // (config.world // config.pp)
    with fake_world(rank, config.world):
        torch.manual_seed(seed)
        model = build()
        no_kv_cache(model)
        model.train()
        (mid,), _ = split_micro((ids,), {}, 0, config.microbatches)
        mod, own = stage_module(model, config, stage, (mid,), {})
        mod.full_output = False                    # torch's stage hands the logits to the loss
        mesh = build_mesh(config, "cpu")
        parallelize_stage(mod, own, config, mesh)
        dt = config.param_dtype if config.mixed_precision == "bf16" and config.dp > 1 else None

        def example(metas):
            # floating activations carry gradients both ways: the static metadata says so
            return tuple(torch.zeros(s, dtype=dt if dt is not None and d.is_floating_point else d)
                         .requires_grad_(d.is_floating_point) for s, d in metas)
        first, last = stage == 0, stage == config.pp - 1
        inputs = (mid,) if first else example(mod.received_metas)
        outputs = example(mod.sent_metas) if not last else \
            (torch.zeros(*mid.shape, int(getattr(model.config, "vocab_size", 0)), dtype=dt or torch.float32),)
        pipe = PipelineStage(mod, stage, config.pp, torch.device("cpu"), input_args=inputs, output_args=outputs,
                             group=mesh["pp"].get_group())
        # the stages agree on static metadata by a vote over P2P, which the fake backend does not carry
        # (it receives zeros: "dynamic", then garbage sizes): every stage here gives its metadata
        _compat.pipeline_stage_static(pipe)

        def loss_fn(logits, target):
            return F.cross_entropy(logits.flatten(0, 1).float(), target.flatten(0, 1))
        sched = schedules[config.schedule](pipe, config.microbatches, loss_fn=loss_fn)
        opt = _optimizer(optimizer, [p for p in mod.parameters() if p.requires_grad], 1e-3)

        def all_steps(on_step) -> None:
            for i in range(steps):
                on_step(i, "begin")
                with loss_context(config), amp_context(config, "cpu"):
                    if first:
                        sched.step(ids, return_outputs=False)
                    elif last:
                        sched.step(target=labels, return_outputs=False)
                    else:
                        sched.step(return_outputs=False)
                opt.step()
                opt.zero_grad(set_to_none=True)
                on_step(i, "end")

        before = state_bytes([_local(t) for t in (*mod.parameters(), *mod.buffers())] + [ids, labels])
        return measure_cpu(all_steps, before, steps)
