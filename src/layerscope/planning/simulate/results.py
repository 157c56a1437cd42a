"""A sharded configuration's per-rank memory, composed from the simulated ranks, and what a real run of it
under torchrun measured (``ParallelRunResult``): plain records; reports/ renders them.

A rank's peak is the most bytes its storages held at once over the simulated steps (the step with the
optimizer state, from the second on), by part (``simulate.PARTS``), plus what a CPU simulation cannot
show, an estimate on its own line (``ESTIMATES``), so a reader sees its weight:

* ``NCCL buffers (estimate)``: NCCL's own device buffers, outside PyTorch's allocator:
  ``NCCL_BUFFSIZE`` (4 MiB) for each of 16 channels per communicator, one communicator per mesh
  dimension the rank is in. NCCL sizes these by topology; the figure is a typical order, not a
  measurement.
  CPU ranks (gloo) have none.
* ``gloo late free (estimate)``: gloo's reduce-scatter all-reduces a clone of its input (simulated, while
  the collective runs); the clone's last reference is its worker thread's, which drops it when the
  thread next runs, after the step has gone on. On this 2-core machine that happened on some ranks and
  not others of the same run (torchrun, 2 and 4 ranks, the CPU allocator's own count of every thread:
  ranks holding the same shards 0 to 12% apart): the line is the largest such clone of the rank, so the
  peak is the most it can reach if one clone outlives its collective. NCCL ranks have none.
The caching allocator's 512-byte rounding is simulated exactly on a CUDA
target, and cuBLAS's two workspaces are a part of their own (``workspaces``); its fragmentation is not
estimated (a note says so).

FSDP2's prefetch on its own CUDA stream adds nothing to this peak: the allocator counts a block from
the moment the CPU asks for it to the moment the CPU gives it back, in program order, whatever the
streams do later, and FSDP2 holds and frees its gathered parameters in that order (its explicit
backward prefetch is torch's own code, which the simulation runs). Measured on an H100 with the ranks'
collectives on the fake backend (bench/bench_gpu.py): the simulation without any prefetch term within
0.45% of ``torch.cuda.max_memory_allocated`` on 8 FSDP and FSDP x TP configurations of a Llama; with one
block's gathered parameters added it read 3.1-6.2% over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...analyses.memory import layer_at, live_bytes
from ..config import ParallelConfig, default_schedule
from ..blocks import canonical_name
from .sharded_rank import HOST_PART, PARTS, RankRun
from .uniform_stages import model_name

__all__ = ["COLLECTIVES", "Collective", "collective_group", "RankMemory", "ParallelPlan", "ESTIMATES", "NCCL_BYTES_PER_COMMUNICATOR",
           "rank_memory",
           "collectives_of", "ring_op", "mesh_coords", "local_numels", "roles", "ParallelRunResult", "measured_figures"]

NCCL_BYTES_PER_COMMUNICATOR = 16 * 4 * 2**20      # 16 channels x NCCL_BUFFSIZE (4 MiB): an estimate
ESTIMATES = ("NCCL buffers (estimate)", "gloo late free (estimate)")

# collective op -> (kind, the mesh dimension its group is)
COLLECTIVES = {
    "c10d._allgather_base_": ("all-gather", "fsdp"),
    "c10d.allgather_into_tensor_coalesced_": ("all-gather", "fsdp"),
    "c10d._reduce_scatter_base_": ("reduce-scatter", "fsdp"),
    "c10d.reduce_scatter_tensor_coalesced_": ("reduce-scatter", "fsdp"),
    "c10d.allreduce_": ("all-reduce", "replicate"),
    "_c10d_functional.all_gather_into_tensor": ("all-gather", "tp"),
    "_c10d_functional.all_gather_into_tensor_out": ("all-gather", "tp"),
    "_c10d_functional.reduce_scatter_tensor": ("reduce-scatter", "tp"),
    "_c10d_functional.all_reduce": ("all-reduce", "tp"),
    "_c10d_functional.all_reduce_": ("all-reduce", "tp"),
    "_c10d_functional.all_to_all_single": ("all-to-all", "tp"),
}


@dataclass(frozen=True, slots=True)
class Collective:
    """One kind of collective a rank runs in a step: how often, and its bytes on this rank.
    ``bytes_read``/``bytes_written``: what the rank contributes and receives (costs/collectives.py);
    ``ring_bytes``: what a ring moves through the rank, (n - 1) / n of the gathered or reduced tensor
    (twice that for an all-reduce); a pipeline's point-to-point sends and receives (kind "send" /
    "recv", group "pp"): the bytes over the link; a weight tied across stages (op "tie.all_reduce",
    group "pp"): its gradient's all-reduce over the stages that hold a copy."""

    op: str
    kind: str
    group: str
    group_size: int
    calls: int
    bytes_read: int
    bytes_written: int
    ring_bytes: int


@dataclass(frozen=True, slots=True)
class RankMemory:
    """One global rank: its mesh coordinates, the rank simulated for its role, its peak (with the
    estimates) and what held it."""

    rank: int
    coords: dict
    simulated_as: int
    peak_bytes: int
    simulated_peak_bytes: int
    peak_step: int                 # 1-based
    peak_phase: str
    peak_layer: str | None
    breakdown: dict                # part -> bytes at the peak (PARTS, then ESTIMATES)
    collectives: tuple[Collective, ...] = ()
    host_bytes: int = 0            # CPU offload onto GPUs: the most the rank held in the host's memory at once
    stages: tuple[int, ...] = (0,)  # the pipeline stages it holds, in order (0 alone without a pipeline)


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    """One configuration and what every rank holds. ``step_time`` (seconds), ``tokens_per_s`` (per GPU)
    and ``mfu``: the step-time model's prediction on CUDA ranks (planning/steptime/sharded_time.py; None on CPU
    ranks), its parts in ``timing``; ``measured``: a real run's figures (``--run``)."""

    gpus: int
    fsdp: int
    replicate: int
    tp: int
    pp: int
    ac: str
    microbatches: int
    accumulation: int
    local_batch: int | None
    global_batch: int | None
    mixed_precision: str
    reduce_dtype: str
    model_dtype: str
    reshard_after_forward: bool
    fits: bool | None
    limit_bytes: int | None
    peak_bytes: int
    over_bytes: int
    ranks: tuple[RankMemory, ...]
    step_time: float | None = None
    tokens_per_s: float | None = None
    mfu: float | None = None
    measured: dict | None = field(default=None)
    offload: bool = False          # FSDP2's CPU offload (the ranks' host_bytes hold what it moves)
    schedule: str = field(default_factory=default_schedule)   # the pipeline schedule (with pp > 1)
    stages: int = 1                # pipeline stages: pp, or pp x stages per rank (interleaved)
    timing: dict | None = None     # the step-time prediction's parts (planning/steptime/sharded_time.py StepTime.to_dict)

    @property
    def label(self) -> str:
        dp = f"fsdp {self.fsdp}" + (f" x replicate {self.replicate}" if self.replicate > 1 else "")
        pp = f"pp {self.pp}" + (f" ({self.schedule}, {self.stages // self.pp} stages per rank)"
                                 if self.stages > self.pp else "")
        # context parallel's degree from the ranks' coordinates (the plan's fields, and so its JSON, as before)
        cp = 1 + max((r.coords.get("cp", 0) for r in self.ranks), default=0)
        return f"{dp}, tp {self.tp}, {pp}" + (f", cp {cp}" if cp > 1 else "") + f", ac {self.ac}" + \
            (", CPU offload" if self.offload else "")

    @property
    def largest(self) -> RankMemory:
        return max(self.ranks, key=lambda r: r.peak_bytes)


def mesh_coords(config: ParallelConfig, rank: int) -> dict[str, int]:
    """A global rank's coordinates on the mesh [pp, dp_replicate, dp_shard, tp] (tp innermost; the
    dimension names are the mesh's own)."""
    out = {}
    dims = (("pp", config.pp), ("dp_replicate", config.replicate), ("dp_shard", config.fsdp)) + \
        ((("cp", config.cp),) if config.cp > 1 else ()) + (("tp", config.tp),)     # cp: only where there is one
    for name, size in reversed(dims):
        rank, out[name] = divmod(rank, size)
    out = dict(reversed(list(out.items())))
    if config.ep > 1:           # the sparse mesh's (efsdp, ep) over the same ranks (planning/expert_parallel.py):
        # (dp_shard, cp, tp) flattened row-major, then cut into (efsdp, ep), as torchtitan's unflatten does
        inner = (out["dp_shard"] * config.cp + out.get("cp", 0)) * config.tp + out["tp"]
        out["efsdp"], out["ep"] = divmod(inner, config.ep)
    return out


def local_numels(layouts, config: ParallelConfig, rank: int) -> tuple[int, ...]:
    """Each sharded parameter's element count on ``rank``: torch's chunking (ceil(n / size) per
    coordinate, the last ones shorter or empty), tensor parallel's split first, then the data-parallel
    dimensions' of the tensor-parallel shard (FSDP2's strided shard over a TP one). ``layouts``: per
    parameter, its global shape and its (mesh dimension, tensor dimension) shards."""
    coords = mesh_coords(config, rank)
    sizes = {**dict(config.mesh_shape), "efsdp": config.efsdp, "ep": config.ep}
    if config.cp > 1:       # FSDP's dimension under context parallel (context_parallel.fsdp_mesh)
        sizes["dp_shard_cp"] = config.fsdp * config.cp
        coords["dp_shard_cp"] = coords["dp_shard"] * config.cp + coords["cp"]
    out = []
    for shape, shards in layouts:
        s = list(shape)
        for name, d in sorted(shards, key=lambda x: x[0] not in ("tp", "ep")):
            n = sizes.get(name, 1)
            c = -(-s[d] // n)
            s[d] = max(0, min(c, s[d] - coords[name] * c))
        total = 1
        for x in s:
            total *= x
        out.append(total)
    return tuple(out)


def roles(layouts, config: ParallelConfig) -> dict[int, list[int]]:
    """The ranks that hold the same shard sizes, grouped: representative rank -> the ranks it stands
    for (the first of each group represents it)."""
    groups: dict[tuple, list[int]] = {}
    for r in range(config.world):
        c = mesh_coords(config, r)
        # a cp rank's place in the ring sets which halves of its chunks each ring step attends: each its own role
        key = (c["pp"], c.get("cp", 0), local_numels(layouts, config, r))
        groups.setdefault(key, []).append(r)
    return {g[0]: g for g in groups.values()}


def _group_size(config: ParallelConfig, group: str) -> int:
    # FSDP shards over dp_shard x cp under context parallel (context_parallel.fsdp_mesh)
    return {"fsdp": config.fsdp * config.cp, "replicate": config.replicate, "tp": config.tp, "cp": config.cp,
            "ep": config.ep}[group]


def collective_group(name: str, read: int, written: int, config: ParallelConfig, ring: bool = False
                     ) -> tuple[str, str, int, int]:
    """A collective op's kind, its mesh dimension, its group's size and the bytes of the whole tensor it
    gathers or reduces (what it writes for an all-gather, what it reads otherwise). ``ring``: issued by
    context parallel's ring (``ring_op``): the cp group's (an all-to-all there is the ring's pass of one
    rank's K/V gradients to the next rank, ``permute_tensor``: ``read`` bytes through each rank)."""
    kind, group = COLLECTIVES[name]
    if ring:
        group = "cp"
    elif kind == "all-to-all" and config.ep > 1:
        group = "ep"                          # expert parallel's dispatch and combine (and its count exchange)
    n = _group_size(config, group)
    if n == 1 and group == "replicate":       # an all-reduce outside HSDP: the data-parallel group
        n = config.dp * config.cp
    if kind == "all-to-all" and not ring:
        # what crosses the rank's link is the larger side, less its own share: every rank sends the same counts
        # to this one (planning/expert_parallel.py's assumption; a real run's even routing), so 1/n of what it
        # receives is its own, and under skew it receives at least what it sends (exact for the rank simulated)
        return kind, group, n, max(read, written)
    return kind, group, n, written if kind == "all-gather" else read


def ring_op(rr: RankRun, p, op) -> bool:
    """Whether trace op ``op`` of pass ``p`` is a collective torch's context-parallel ring issued."""
    ops = getattr(getattr(rr, "ring", None), "tracker", None) and rr.tracker.ring_ops
    return bool(ops) and p.offset + op.index in ops


def collectives_of(rr: RankRun, config: ParallelConfig, micro: int | None = None) -> tuple[Collective, ...]:
    """The collectives of the last simulated step (its passes' ops and the optimizer's); ``micro``: of
    its first ``micro`` passes only."""
    last = max((p.step for p in rr.run.passes), default=0)
    acc: dict[str, list[int]] = {}
    for p in rr.run.passes:
        if p.step != last or (micro is not None and p.micro >= micro):
            continue
        for op in p.trace.ops:
            if op.op in COLLECTIVES:
                in_ring = ring_op(rr, p, op)
                a = acc.setdefault((op.op, in_ring), [0, 0, 0, 0])
                a[0] += 1
                a[1] += op.costs.bytes_read
                a[2] += op.costs.bytes_written
                kind, _, n, whole = collective_group(op.op, op.costs.bytes_read, op.costs.bytes_written, config,
                                                     in_ring)
                if kind == "all-to-all" and not in_ring:   # each call's larger side (priced one by one)
                    a[3] += whole * (n - 1) // n
    out = []
    for (name, in_ring), (calls, read, written, a2a) in acc.items():
        kind, group, n, whole = collective_group(name, read, written, config, in_ring)
        if kind == "all-to-all":
            # the ring's all-to-all is a permute: each rank sends all it reads to the next one
            ring = read if in_ring else a2a
        else:
            ring = whole * (n - 1) // n * (2 if kind == "all-reduce" else 1)
        out.append(Collective(("cp." if in_ring else "") + name, kind, group, n, calls, read, written, ring))
    if rr.p2p is not None:
        sent, received, transfers = rr.p2p
        if transfers:
            out.append(Collective("p2p.send", "send", "pp", 2, transfers, sent, 0, sent))
            out.append(Collective("p2p.recv", "recv", "pp", 2, transfers, 0, received, received))
    for nbytes, n in rr.ties:
        # a weight tied across stages: its gradient's shard summed over the stages holding a copy, once a step
        out.append(Collective("tie.all_reduce", "all-reduce", "pp", n, 1, nbytes, nbytes, nbytes * (n - 1) // n * 2))
    return tuple(sorted(out, key=lambda c: c.op))


def _live_parts(rr: RankRun) -> tuple[dict[str, list[int]], list[int]]:
    """Per part, the bytes live during each op, and the device's total (the host's part, with CPU
    offload, is in ``live`` under HOST_PART and not in the total)."""
    names = PARTS + (HOST_PART,)
    index = {p: i for i, p in enumerate(names)}
    during, _, _ = live_bytes(rr.tracker.blocks, rr.tracker.clock + 1, len(names), lambda b: index[rr.part(b)])
    live = dict(zip(names, during))
    total = [sum(col) for col in zip(*during[:len(PARTS)])]
    return live, total


def rank_memory(rr: RankRun, config: ParallelConfig, rank: int, *, nccl: bool) -> RankMemory:
    """Global rank ``rank``'s memory, from the simulation of the rank ``rr`` that plays its role;
    ``nccl``: its collectives run on NCCL (the estimate of NCCL's buffers is added); on gloo, a
    reduce-scatter's clone its worker may free late (the tracker's ``gloo_late_bytes``)."""
    live, total = _live_parts(rr)
    run = rr.run
    t = max(range(len(total)), key=total.__getitem__) if total else 0
    step, phase = 0, "optimizer"
    for s, ph, first, last in run.phase_ranges:
        if first <= t <= last:
            step, phase = s, ph
            break
    layer = layer_at(run, t)
    if layer is not None:      # named as in the user's model (a checkpoint wrapper's own level left out)
        layer = canonical_name(layer)
        if config.pp > 1:      # a pipeline rank runs its stage module (or a list of them), holding the model as .model
            layer = model_name(layer)
    breakdown: dict[str, Any] = {p: live[p][t] if total else 0 for p in PARTS}
    estimates = dict.fromkeys(ESTIMATES, 0)
    if nccl:
        estimates[ESTIMATES[0]] = NCCL_BYTES_PER_COMMUNICATOR * len(config.mesh_shape)
    estimates[ESTIMATES[1]] = getattr(rr.tracker, "gloo_late_bytes", 0)
    breakdown.update(estimates)
    simulated = total[t] if total else 0
    return RankMemory(rank=rank, coords=mesh_coords(config, rank), simulated_as=rr.rank,
                      peak_bytes=simulated + sum(estimates.values()), simulated_peak_bytes=simulated,
                      peak_step=step + 1, peak_phase=phase, peak_layer=layer, breakdown=breakdown,
                      collectives=collectives_of(rr, config), host_bytes=max(live[HOST_PART], default=0))


@dataclass(frozen=True)
class ParallelRunResult:
    config: object                       # the ParallelConfig run
    ranks: tuple[dict, ...]              # global-rank order: rank, coords {dim: index}, peak_bytes (per
    #                                      step, bytes), before_bytes (its shards, buffers and batch
    #                                      before the first step), times (seconds per step, timed
    #                                      without the profiler), local_params (elements it holds)
    losses: tuple[float, ...]            # per step: the mean over the data-parallel ranks' losses
    reference_losses: tuple[float, ...]  # one process, the whole global batch, same optimizer
    loss_rtol: float                     # the tolerance loss_equal uses (1e-5 fp32; larger for bf16)
    max_rel_grad_diff: float | None      # step 1: max over parameters of |g - g_ref| / |g_ref| (2-norms)

    @property
    def loss_equal(self) -> bool:
        return len(self.losses) == len(self.reference_losses) and all(
            abs(a - b) <= self.loss_rtol * abs(b) for a, b in zip(self.losses, self.reference_losses))

    @property
    def max_rel_loss_diff(self) -> float:
        return max((abs(a - b) / max(abs(b), 1e-30) for a, b in zip(self.losses, self.reference_losses)),
                   default=0.0)

    @property
    def step_time(self) -> float:
        """Seconds of one step: per step the slowest rank's, the median over the timed steps."""
        steps = min(len(r["times"]) for r in self.ranks)
        xs = sorted(max(r["times"][i] for r in self.ranks) for i in range(steps))
        return xs[len(xs) // 2] if xs else float("nan")

    @property
    def peak_bytes(self) -> tuple[int, ...]:
        """Per rank, its largest peak over the steps."""
        return tuple(max(r["peak_bytes"]) for r in self.ranks)


def measured_figures(real: "ParallelRunResult") -> dict:
    """A real run's figures as a plan's ``measured``: per rank (global order) its largest per-step peak
    from the allocator's events, the step time, and the losses against one process."""
    return {"ranks": [{"rank": r.get("rank", i), "peak_bytes": max(r["peak_bytes"])} for i, r in enumerate(real.ranks)],
            "step_time": real.step_time, "loss_equal": real.loss_equal,
            "max_rel_loss_diff": real.max_rel_loss_diff, "max_rel_grad_diff": real.max_rel_grad_diff,
            "losses": list(real.losses), "reference_losses": list(real.reference_losses),
            "method": "torchrun, gloo, the CPU allocator's own count of every thread's blocks"}
