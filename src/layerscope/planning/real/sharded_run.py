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
from typing import Any, Callable, NamedTuple

import torch
from torch import nn

from ...errors import InputError
from ..config import ParallelConfig
from ..apply import amp_context, build_mesh, data_parallel_rank, loss_context, parallelize
from ..blocks import canonical_tensors, local_tensor as _local, no_kv_cache
from .torch_stages import _micro_loss, _rank_pipeline, _stage_buffers, pipeline_step, sum_tied_grads, tie_groups

__all__ = ["make_batch", "reference_run", "run_rank", "training_loss", "measure_one_rank", "measure_stage_rank",
           "OPTIMIZERS"]


OPTIMIZERS = ("adamw", "sgd")
# a rank's stderr while its steps are measured (the allocator's count; the launcher reads what else it
# holds when the rank dies)
STDERR_LOG = "stderr.log"
# step 1's gradients, full tensors, of the parameters one rank of each stage holds
GRADS = "grads.pt"


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
    return _micro_loss(_logits(model(ids)), labels)


def _optimizer(name: str, params, lr: float):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr)
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    raise InputError(f"optimizer must be one of {', '.join(OPTIMIZERS)}, got {name!r}")


def reference_run(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor, *, steps: int, optimizer: str,
                  lr: float) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the whole global batch, the same loss and optimizer: (loss per step, {name:
    gradient of step 1}). The steps run on capture's step engine (measured, nothing tracked), which
    gives the model its weights back afterwards."""
    from ...capture.spec import StepSpec, StepWatch
    from ...capture.step import run_steps

    no_kv_cache(model)
    model.train()
    losses: list[float] = []
    grads: dict[str, torch.Tensor] = {}

    def loss_fn(out) -> torch.Tensor:
        loss = _micro_loss(_logits(out), labels)
        losses.append(loss.item())
        return loss

    def on_grads(step: int) -> None:
        if step == 0:
            grads.update({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})

    spec = StepSpec(model, (ids,), loss_fn=loss_fn, steps=steps, simulate=False, device=ids.device,
                    optimizer=lambda params: _optimizer(optimizer, [p for p in params if p.requires_grad], lr))
    run_steps(spec, StepWatch(on_grads=on_grads))
    return losses, grads


def run_rank(build: Callable[[], nn.Module], config: ParallelConfig, *, batch: int, seq: int, steps: int,
             optimizer: str, lr: float, seed: int, out_dir: str) -> None:
    """What one rank does (see the module's doc); writes ``out_dir``/rank<R>.json and, on rank 0,
    grads.pt (step 1's gradients, full tensors named as in the unparallelized model)."""
    import torch.distributed as dist

    from ...capture.measure import count_cpu_allocations, measure_cpu

    # the CPU allocator counts every thread's blocks from here on, before the model and the gloo group
    # exist: gloo's worker threads make buffers and free the step's tensors the profiler never sees
    count_cpu_allocations()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != config.world:
        raise InputError(f"torchrun started {world} ranks, the configuration needs {config.world}")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        model, vocab = _build_model(build, seed)
        ids, labels = make_batch(vocab, batch, seq, seed + 1)
        mesh = build_mesh(config, "cpu")
        dp_rank = data_parallel_rank(config, mesh)
        rows = batch // config.dp
        my_ids, my_labels = ids[dp_rank * rows:(dp_rank + 1) * rows], labels[dp_rank * rows:(dp_rank + 1) * rows]
        placed = _place(build, model, config, mesh, (my_ids, my_labels), seed)
        model, pipe = placed.model, placed.pipe
        opt = _optimizer(optimizer, [p for p in model.parameters() if p.requires_grad], lr)
        losses: list[float] = []
        times: list[float] = []
        # the ranks that hold the loss: every rank, or the last stage's (the others add 0)
        one_step = _step_fn(placed, opt, config, (my_ids, my_labels), (times, losses), world // config.pp)

        def all_steps(on_step) -> None:
            for i in range(2, steps):
                on_step(i - 2, "begin")
                one_step(True)
                on_step(i - 2, "end")

        # steps 1 and 2 unmeasured. Step 1's gradients are gathered for the comparison (on the first
        # rank of each stage they stay alive, outside what the measured steps hold). Step 2 is a
        # warm-up: measured, it held more than every later step (FSDP 2 on gloo, shrunk Llama, 6-step
        # runs: 1,955 KiB against 1,740-1,744 KiB on both ranks; on the fake backend, in one process,
        # 941 against 913 KiB of growth), which the simulation's second step, already its steady
        # state, does not show. Each measured step starts with the optimizer's state and the last
        # step's gradients alive (and a pipeline stage's receive buffers).
        one_step(True)
        # inline, not a helper: ``g`` (the last gradient gathered) stays alive to the end, as it did
        keeper, grads = _keeper(mesh), {}
        for n, p in model.named_parameters():
            if p.grad is not None:
                g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
                if keeper:
                    # a stage module wraps the model as ``model`` (several: a list of them, "0.model.")
                    grads[_model_name(n) if pipe is not None else n] = g.detach().clone()
        one_step(True)
        before = _before_bytes(model, opt, pipe, (my_ids, my_labels))
        # every thread's allocations and frees: gloo's worker threads allocate buffers and free the
        # step's tensors (recorded on the step's thread alone, the peaks drifted up step after step)
        measured = measure_cpu(all_steps, before, steps - 2, threads=True,
                               log_path=os.path.join(out_dir, f"rank{rank}.{STDERR_LOG}"))
        _time_steps(one_step, times, steps)
        coords = {}
        if mesh is not None:
            coords = {n: mesh.get_local_rank(n) for n in mesh.mesh_dim_names}
        out = {"rank": rank, "coords": coords, "dp_rank": dp_rank, "peak_bytes": list(measured.step_peaks),
               "before_bytes": before, "times": times, "losses": losses,
               "local_params": sum(_local(p).numel() for p in model.parameters()),
               "batch_rows": int(my_ids.shape[0])}
        _write(out_dir, rank, out, grads if keeper else None)
    finally:
        dist.destroy_process_group()


def _keeper(mesh) -> bool:
    """Whether this rank keeps its stage's first gradients: the first rank of its stage."""
    return mesh is None or all(mesh.get_local_rank(n) == 0 for n in mesh.mesh_dim_names if n != "pp")


def _model_name(name: str) -> str:
    """A stage module's parameter name in the model (uniform_stages.model_name)."""
    from ..simulate.uniform_stages import model_name
    return model_name(name)


def _time_steps(one_step: Callable, times: list, steps: int) -> None:
    """``steps`` more steps timed into ``times``, without the allocation count or the profiler."""
    from ...capture.measure import count_cpu_allocations

    count_cpu_allocations(on=False)   # the timed steps without the count's lock and table
    times.clear()
    for _ in range(steps):          # timed without the profiler
        one_step(False)


def _build_model(build: Callable[[], nn.Module], seed: int) -> tuple[nn.Module, int]:
    """(the model built with ``seed``, in training mode without a KV cache, its vocabulary size);
    a model without ``config.vocab_size`` -> InputError."""
    torch.manual_seed(seed)                  # same weights on every rank before sharding
    model = build()
    no_kv_cache(model)
    model.train()
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
    if vocab < 1:
        raise InputError("the model has no config.vocab_size to draw token ids from")
    return model, vocab


class _Placed(NamedTuple):
    """What a rank trains: its model (parallelized, or its pipeline stages as one module), and under
    pipeline parallelism its PipelineStages, torch's schedule and each stage's ties; without it, the
    rank's batch in its accumulation chunks."""

    model: nn.Module
    pipe: Any = None
    sched: Any = None
    ties: Any = None
    chunks: Any = None


def _place(build: Callable[[], nn.Module], model: nn.Module, config: ParallelConfig, mesh,
           batch: tuple, seed: int) -> _Placed:
    """``model`` parallelized by ``config`` on ``mesh``, or (pipeline parallel) this rank's stages of
    the uniform split (one, or several under interleaved 1F1B and zero bubble, each cut from a model
    built alike), torch's PipelineStage and schedule on the pp group; one schedule step per
    optimizer step (its micro-batches accumulate the gradients)."""
    my_ids, my_labels = batch
    if config.pp <= 1:
        parallelize(model, config, mesh)
        acc = config.accumulation
        return _Placed(model, chunks=list(zip(my_ids.tensor_split(acc), my_labels.tensor_split(acc))))
    from ..simulate.uniform_stages import as_module, rank_stages
    mine = rank_stages(config, mesh.get_local_rank("pp"))
    tied = tie_groups(model, config, mesh, mine)
    mods, pipe, sched = _rank_pipeline(build, config, mesh, mine, my_ids, seed=seed, model=model)
    ties = [(m, tied[stage]) for m, stage in zip(mods, mine)]
    return _Placed(as_module(mods), pipe, sched, ties)


def _step_fn(placed: _Placed, opt, config: ParallelConfig, batch: tuple, kept: tuple,
             holders: int) -> Callable[[bool], None]:
    """One training step of the rank: ``one_step(record)`` appends its seconds to ``kept``'s
    times and, with ``record``, the loss (averaged over the ``holders`` ranks that hold it) to its
    losses."""
    import torch.distributed as dist

    model, pipe, sched, ties, chunks = placed
    my_ids, my_labels = batch
    times, losses = kept
    acc = config.accumulation

    def one_step(record: bool) -> None:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        total = torch.zeros(())
        if pipe is not None:
            micro: list = []
            with loss_context(config), amp_context(config, "cpu"):
                pipeline_step(sched, pipe, my_ids, my_labels, micro)
            sum_tied_grads(ties)
            for loss in micro:
                total += _local(loss).detach().float() / len(micro)
        else:
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
            losses.append(float(total) / holders)
    return one_step


def _before_bytes(model: nn.Module, opt, pipe, batch: tuple) -> int:
    """The bytes alive before the measured steps: parameters, buffers, the rank's batch, gradients,
    the optimizer's state, a pipeline stage's receive buffers. The list of them dies on return: held,
    it kept the warm-up's gradients alive through every measured step (zero_grad freed nothing),
    180,864 B (every gradient) above the real peak on FSDP 2."""
    from ...capture.measure import state_bytes

    held = [_local(t) for t in (*model.parameters(), *model.buffers())] + list(batch)
    held += [_local(p.grad) for p in model.parameters() if p.grad is not None]
    held += [_local(t) for st in opt.state.values() for t in st.values() if isinstance(t, torch.Tensor)]
    if pipe is not None:
        held += [t for p in pipe for t in _stage_buffers(p)]
    return state_bytes(held)


def _write(out_dir: str, rank: int, out: dict, grads: dict | None) -> None:
    """rank<R>.json, and rank<R>.grads.pt unless ``grads`` is None (not the keeper of its stage)."""
    if grads is not None:
        torch.save(canonical_tensors(grads), os.path.join(out_dir, f"rank{rank}.{GRADS}"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)


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
    from ...capture.measure import measure_cpu, measure_cuda, state_bytes
    from ...capture.storage import cuda_block_size
    from ..simulate.sharded_rank import fake_world

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
                       labels: torch.Tensor, *, steps: int = 3, optimizer: str = "adamw", seed: int = 0,
                       device: str = "cpu"):
    """The pipeline equivalent of ``measure_one_rank`` (``pp`` > 1): rank ``rank``'s stage (the uniform
    split, planning/simulate/pipeline_rank.py; under a schedule with several stages per rank its stages, each from a
    model built alike) built from a real model and parallelized on the mesh without ``pp``, trained
    ``steps`` steps by torch's own ``PipelineStage`` and schedule (``ScheduleGPipe``, ``Schedule1F1B``,
    ``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble`` or ``ScheduleZBVZeroBubble``,
    ``return_outputs=False``) on ``ids``/``labels`` (the rank's local batch,
    split into ``config.microbatches``), its P2P transfers and collectives on torch's ``fake`` backend.
    The loss: ``training_loss``'s cross-entropy on the logits, per micro-batch. Each step's peak from
    the allocator, as ``measure_one_rank`` reads it on ``device`` (cpu or cuda: the whole model moved to
    the current CUDA device before its stage is cut). Returns the ``Measured`` record."""
    from ...capture.measure import measure_cpu, measure_cuda, state_bytes
    from ...capture.storage import cuda_block_size
    from ..simulate.sharded_rank import fake_world

    if device not in ("cpu", "cuda"):
        raise InputError(f"measure_stage_rank runs on cpu or cuda, not {device!r}")
    from ..simulate.uniform_stages import as_module, rank_stages
    mine = rank_stages(config, rank // (config.world // config.pp))
    here = torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device("cpu")
    with fake_world(rank, config.world):
        mesh = build_mesh(config, device)
        if device == "cuda":
            ids, labels = ids.to(here), labels.to(here)
        # the stages agree on static metadata by a vote over P2P, which the fake backend does not carry (it
        # receives zeros: "dynamic", then garbage sizes): every stage here gives its metadata
        mods, pipe, sched = _rank_pipeline(build, config, mesh, mine, ids, seed=seed, static=True,
                                           device=here if device == "cuda" else None)
        mod = as_module(mods)
        opt = _optimizer(optimizer, [p for p in mod.parameters() if p.requires_grad], 1e-3)

        def all_steps(on_step) -> None:
            for i in range(steps):
                on_step(i, "begin")
                with loss_context(config), amp_context(config, device):
                    pipeline_step(sched, pipe, ids, labels)
                opt.step()
                opt.zero_grad(set_to_none=True)
                on_step(i, "end")

        own = [_local(t) for t in (*mod.parameters(), *mod.buffers())] + [ids, labels]
        if device == "cuda":
            return measure_cuda(all_steps, here, steps, state_bytes(own, here, cuda_block_size))
        return measure_cpu(all_steps, state_bytes(own), steps)
