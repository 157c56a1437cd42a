"""Lower bounds on a candidate's peak memory and predicted step time, from one block's figures
simulated without a pipeline: what lets the search (planning/search/space.py) rule out a configuration
without simulating it (a pipeline's stages' every micro-batch, minutes each on a 70B model; seconds
without one). A configuration without a pipeline is taken as a pipeline of one stage whose
micro-batches are its gradient accumulation's micro-steps (one in flight at a time).

The block's figures come from a configuration without a pipeline that runs the same block on the same
micro-batch: the same tensor and context parallel degrees, checkpointing mode and micro-batch size, with
or without data parallelism as the candidate has it (FSDP2's mixed precision, or torch.autocast without
it: they save other tensors). For one block of rank 0 of that simulated configuration (``block_figures``;
rank 0 alone is simulated for them, ``WorldRun.first_only``): the seconds of its forward and of its
backward (recompute included) that the step-time model gives its ops, and those of its tensor-parallel
collectives and of context parallel's ring (on the critical path there, priced on the same link: the same
degree and bytes; under context parallel rank 0's place in the ring is the candidate's rank 0's), leaving
out the other collectives and FSDP2's copies in and out of them (their sizes depend on the
FSDP degree, and a pipeline gathers a stage once a step); and the bytes of the
activations its ops made that are still alive when the step's last forward ends (what a micro-batch's
forward leaves a block holding for its backward: a checkpointed block's input, every tensor an
unchecked block saves). The model's blocks are taken to be alike, as the search's extension from its
shrunk copies takes them (``search`` module docstring); the least of the copy's blocks is used. The
same seconds of the modules with parameters before the block list (the embedding, on a pipeline's first
stage) and after it (the final norm and the head, on its last; ``uniform_stages`` gives a stage these
modules as the split does): the same modules on the same micro-batch, outside any block's checkpointing.
The loss is not among them: without a pipeline the model's forward computes it, a pipeline's last stage
with the schedule's loss function.

Memory (``pipeline_bounds``). At the moment a rank of pipeline coordinate ``c`` has run the forwards
its schedule runs before a backward frees them (``pipeline.schedule.rank_orders``: the warm-up of
1F1B, the interleaved schedule's), it holds at once, each of these in storage of its own:

* its parameters' shards: at least ``numel / (tp x fsdp x cp)`` elements of each parameter its stages
  own (FSDP shards over ``fsdp x cp`` under context parallel, as torchtitan's; a tensor-parallel shard or
  a replicated one is no smaller), in the model's dtype (the master
  weights under bf16 mixed precision), unless offloaded to the host;
* the optimizer's state of those shards, at the least ratio of state to parameter bytes the block's
  simulated rank held (AdamW: 2; none when the steps simulated leave no state alive at that moment);
* with FSDP and ``reshard_after_forward`` off under a schedule of one stage per rank, every parameter
  of its stage gathered (in the compute dtype, at least ``numel / tp``): FSDP2 keeps them from the first
  forward to the last backward;
* for each micro-batch forwarded and not yet backwarded, every block of its stage holding the block's
  activation bytes (one block fewer on the last stage: the model's last block, whose output the final
  norm may save in a copy of its own); for one such micro-batch only under bf16 without data
  parallelism, whose one autocast region over the step makes the casts of the weights the micro-batches
  share, and which the block's figures count among its saved bytes;
* in a pipeline under a schedule of one stage per rank and whole backwards (1F1B, GPipe), between its
  stage's first backward and its last, the gradients of its parameters, unsharded (at least ``numel / tp`` elements)
  in the reduce dtype or the model's, the smaller, with FSDP (every backward of a pipeline runs with
  gradient sync off: FSDP2 accumulates them unsharded and reduce-scatters after the last), in the
  model's dtype without it (torch's runtime schedules, interleaved and zero bubble, reduce and let go
  of a stage's gradients on their own terms: not counted there; nor without a pipeline, where FSDP2
  reduce-scatters each micro-step's gradients);
* the cuBLAS workspaces the block's rank held, and the estimate of NCCL's buffers (16 channels x 4 MiB
  per communicator, one per mesh dimension), which a simulated rank's peak adds as well.

Step time (``step_bound``, argued in planning/search/step_bound.py). The step-time model's step is a
longest path through the schedule's actions (one stage and its micro-steps without a pipeline), each
pipeline coordinate's role's seconds shared among its stages' actions; the bound is, for a few of those
paths, the least seconds the path can take given what is known of each role: its blocks' and outer
modules' forward and backward compute (each action at least its share), those and their tensor-parallel
collectives together, and the walk's end at least the host's issue of those ops or, in a pipeline with
FSDP, their compute followed by the stage's last reduce-scatter of its accumulated gradients, or,
without a pipeline, FSDP2's gathers and reduce-scatters one after the other on the communication
stream; each rank's optimizer step over the least its shards can hold (the optimizer's seconds are
linear in those bytes, ``timing.optimizer_seconds``; none with CPU offload). Used where every rank of a
stage holds shards of the same sizes (the block's simulated rank was the only role, or under context
parallel without a pipeline one role a place in the ring: ``one_role``): ranks of uneven shards are
timed by their slowest role, whose compute may be another's.

Both are checked against whole pipeline simulations in tests/planning/sharded/test_bounds.py: never above them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from ..blocks import find_blocks
from ..config import ParallelConfig, default_schedule
from ..steptime.schedule import rank_orders, stage_ranks
from ...trace import BACKWARD, FORWARD
from ..simulate.results import COLLECTIVES, NCCL_BYTES_PER_COMMUNICATOR, collective_group, ring_op
from ..simulate.sharded_rank import COMM_OPS
from ..simulate.uniform_stages import _outer_paths, stage_blocks, stage_params
from ...errors import InputError
from ..steptime.sharded_time import _compute_dtype, _one_collective, op_seconds, optimizer_seconds
from .step_bound import chain_seconds, reduce_seconds, step_bound, stream_seconds

__all__ = ["BlockFigures", "NO_OUTER", "Outer", "PipelineBounds", "block_figures", "figures_at", "one_role", "outer_paths",
           "least_block", "pipeline_bounds", "proxy_config", "regathered", "stage_numels"]


@dataclass(frozen=True)
class Outer:
    """The modules with parameters outside the block list on one side of it, for one micro-batch (module
    docstring): the seconds of their ops' forward and backward and of their tensor-parallel collectives,
    and their ops."""

    forward: float = 0.0
    backward: float = 0.0
    tp: float = 0.0
    ops: int = 0


NO_OUTER = Outer()


@dataclass(frozen=True)
class BlockFigures:
    """One block of a simulated rank without a pipeline, for one micro-batch (module docstring)."""

    forward: float          # seconds: its forward's ops (no collective, no FSDP copy)
    backward: float         # its backward's (recompute included)
    saved: int              # bytes of activations its forward leaves alive for its backward
    ops: int                # its forward's and backward's ops, views too (the host issues each)
    optimizer_ratio: float  # the least optimizer state per parameter byte alive at the forward's end (0: none)
    optimizer_per_byte: float   # the optimizer step's seconds per byte of the rank's parameter shards
    workspaces: int         # cuBLAS's workspaces alive then
    nccl: bool              # the rank's peak adds the estimate of NCCL's buffers
    one_role: bool          # every rank held shards of the same sizes
    tp: float = 0.0         # its tensor-parallel collectives' seconds, forward and backward
    first: Outer = NO_OUTER    # the modules before the blocks (the embedding): the first stage's
    last: Outer = NO_OUTER    # those after them (the final norm, the head): the last stage's; not the loss


@dataclass(frozen=True)
class PipelineBounds:
    peak_bytes: int         # the largest simulated peak among the ranks at that pipeline coordinate is no lower
    step_time: float | None  # the predicted step is no shorter (None: no bound, uneven shards)
    rank: int               # the pipeline coordinate whose memory gives the bound
    activations: bool = True    # the peak counts a block's activations (False: no block's figures were known)


def proxy_config(c: ParallelConfig, micro_batch: int) -> ParallelConfig | None:
    """The configuration without a pipeline whose block figures bound ``c``'s: ``c``'s tensor parallel
    degree, checkpointing, dtypes and options, one micro-batch of ``micro_batch`` samples, FSDP over 2
    ranks where ``c`` has data parallelism (none where it has not, as bf16 then runs under autocast);
    under context parallel none beside its ``cp`` ranks, over which FSDP shards anyway (FSDP2's mixed
    precision either way: a block's ops and saved tensors are the same, FSDP's own left out); None where
    that would be one rank (its bf16 would not run as the pipeline's ranks run it)."""
    dp = 2 if c.dp > 1 and c.cp == 1 else 1
    if c.tp * c.cp * dp == 1:
        return None
    return dataclasses.replace(c, gpus=c.tp * c.cp * dp, pp=1, fsdp=dp, replicate=1, microbatches=1,
                               accumulation=1, local_batch=micro_batch, global_batch=None,
                               reshard_after_forward=False, schedule=default_schedule())


def one_role(groups: dict[int, list[int]], config: ParallelConfig) -> bool:
    """Whether the simulated rank 0 of ``config`` (no pipeline; ``groups``: the simulation's roles) stands
    for every rank's shards: one role, or under context parallel one role a place in the ring (the roles
    then differ in which halves of its chunks each ring step attends, not in their shards)."""
    return len(groups) == 1 or (config.pp == 1 and config.cp > 1 and len(groups) == config.cp)


def outer_paths(model: nn.Module, block_paths: list[str]) -> tuple[list[str], list[str]]:
    """The modules with parameters outside the block list at ``block_paths``: those before it (the first
    stage's, as the uniform split gives them) and after it (the last stage's); none where a module holds
    parameters of its own beside the list (the split refuses it)."""
    try:
        return _outer_paths(model, block_paths[0].rpartition(".")[0])
    except InputError:
        return [], []


def _in_block(path: str, groups: list[list[str]]) -> int | None:
    """The index of the group of module paths ``path`` lies in (a module of it or below one)."""
    for i, group in enumerate(groups):
        if any(path == b or path.startswith(b + ".") for b in group):
            return i
    return None


class _BlockOf:
    """``_in_block(path, groups)`` by the path's prefixes in a dictionary, each path once: the same
    answer (the first group, in ``groups``' order, holding the path or a module above it), without a scan
    of every block for every op and saved tensor (a composed 80-block rank's figures read 80 block paths
    against some 37,000 records: about a twentieth of a composed candidate's CPU)."""

    def __init__(self, groups: list[list[str]]) -> None:
        self.first: dict[str, int] = {}
        for i, group in enumerate(groups):
            for b in group:
                self.first.setdefault(b, i)
        self.memo: dict[str, int | None] = {}

    def __call__(self, path: str) -> int | None:
        got = self.memo.get(path, -1)
        if got != -1:
            return got
        found, parts = None, path.split(".")
        for j in range(1, len(parts) + 1):
            i = self.first.get(".".join(parts[:j]))
            if i is not None and (found is None or i < found):
                found = i
        self.memo[path] = found
        return found


def block_figures(rr, config: ParallelConfig, gpu, f, block_paths: list[str], *, nccl: bool, one_role: bool,
                  outer: tuple[list[str], list[str]] = ([], [])) -> BlockFigures | None:
    """The figures of the blocks at ``block_paths`` on the simulated rank ``rr`` (a RankRun of ``config``,
    no pipeline): the least of them (module docstring), and of the modules at ``outer`` (those with
    parameters before the block list and after it: ``uniform_stages.outer_paths``); None without two blocks
    or a last-step forward."""
    run = rr.run
    if len(block_paths) < 2 or not run.passes:
        return None
    last = max(p.step for p in run.passes)
    ends = [hi for s, ph, _, hi in run.phase_ranges if s == last and ph == FORWARD]
    if not ends:
        return None
    end = ends[-1]
    micro = max(p.micro for p in run.passes if p.step == last)     # one micro-step of an accumulation
    dtype = _compute_dtype(config)
    groups = [[b] for b in block_paths] + [list(outer[0]), list(outer[1])]     # each block, then either side
    fwd, bwd, tps = [0.0] * len(groups), [0.0] * len(groups), [0.0] * len(groups)
    ops = [0] * len(groups)
    block_of = _BlockOf(groups)
    for p in run.passes:
        if p.step != last or p.micro != micro:
            continue
        layers = p.trace.layers
        for op in p.trace.ops:
            in_ring = op.op in COLLECTIVES and ring_op(rr, p, op)
            tp = op.op in COLLECTIVES and (in_ring or collective_group(
                op.op, op.costs.bytes_read, op.costs.bytes_written, config)[1] == "tp")
            # tensor parallel's collectives are counted, and context parallel's ring (both on the critical
            # path in the step-time model; their functional ops are among COMM_OPS, the communication
            # buffers' makers); FSDP's, and its copies in and out, are not (their sizes depend on the FSDP
            # degree, and a pipeline gathers once a step)
            if not tp and (op.op in COLLECTIVES or op.op in COMM_OPS or op.op.startswith("fsdp.")):
                continue
            if op.layer is None or not 0 <= op.layer < len(layers) or op.phase not in (FORWARD, BACKWARD):
                continue
            i = block_of(layers[op.layer].path)
            if i is None:
                continue
            if tp:
                tps[i] += _one_collective(op, config, gpu, f, in_ring)
            elif op.phase == FORWARD:
                fwd[i] += op_seconds(op, gpu, dtype, f)
            else:
                bwd[i] += op_seconds(op, gpu, dtype, f)
            ops[i] += 1
    n = len(block_paths)
    saved = [0] * n
    alive: dict[str, int] = {}
    for b in rr.tracker.blocks:
        if b.alloc > end or (b.free is not None and b.free < end):
            continue
        part = rr.part(b)
        alive[part] = alive.get(part, 0) + b.nbytes
        if part != "activations" or not 0 <= b.pass_index < len(run.passes):
            continue
        layers = run.passes[b.pass_index].trace.layers
        if b.layer is None or not 0 <= b.layer < len(layers):
            continue
        i = block_of(layers[b.layer].path)
        i = i if i is not None and i < n else None
        if i is not None:
            saved[i] += b.nbytes
    ratio = 0.0
    if alive.get("optimizer state", 0) > 0:
        per = [run.optimizer_bytes.get(n, 0) / v for n, v in run.param_bytes.items() if v]
        ratio = min(per, default=0.0)
    params = sum(run.param_bytes.values())
    step = optimizer_seconds(run, gpu, f) / params if params else 0.0
    first, after = (Outer(fwd[i], bwd[i], tps[i], ops[i]) for i in (n, n + 1))
    return BlockFigures(forward=min(fwd[:n]), backward=min(bwd[:n]), saved=min(saved[:n - 1]), ops=min(ops[:n]),
                        optimizer_ratio=ratio, optimizer_per_byte=step, workspaces=alive.get("workspaces", 0),
                        nccl=nccl, one_role=one_role, tp=min(tps[:n]), first=first, last=after)


def figures_at(known: list[tuple[int, BlockFigures]], batch: int) -> BlockFigures:
    """A block's figures at micro-batch ``batch`` no larger than its true ones, from its figures at smaller
    or equal micro-batches (``known``: (micro-batch, figures), ascending). Every op's seconds in the
    step-time model are a maximum of terms linear in the batch with intercepts of their own (FLOPs,
    bytes moved, a launch; a collective's are its bytes over the link plus its hops' latency), so
    a block's seconds (and the outer modules') are convex and non-decreasing in the batch; so are its
    saved bytes (each saved tensor's size linear in the batch). Hence from the two largest points the
    line through them, and from one point its value, each no larger than the figure at ``batch``."""
    b2, f2 = known[-1]
    if b2 == batch or len(known) < 2:
        return f2
    b1, f1 = known[-2]

    def line(a: float, b: float) -> float:
        return max(b, b + (batch - b2) * (b - a) / (b2 - b1))
    def outer(a: Outer, b: Outer) -> Outer:
        return Outer(line(a.forward, b.forward), line(a.backward, b.backward), line(a.tp, b.tp), b.ops)
    return dataclasses.replace(f2, forward=line(f1.forward, f2.forward), backward=line(f1.backward, f2.backward),
                               saved=int(line(f1.saved, f2.saved)), tp=line(f1.tp, f2.tp),
                               first=outer(f1.first, f2.first), last=outer(f1.last, f2.last))


def regathered(model: nn.Module) -> int:
    """Elements of the parameters of the model's blocks (``find_blocks``) but the largest block's: at least
    what FSDP2 gathers again in a step's backward where it reshards each block after the forward."""
    sizes = [sum(p.numel() for p in b.parameters()) for _, b in find_blocks(model)]
    return sum(sizes) - max(sizes, default=0)


def least_block(model: nn.Module) -> tuple[int, int]:
    """The least elements of a block's parameters (``find_blocks``), and the least trainable ones."""
    blocks = [b for _, b in find_blocks(model)]
    return (min((sum(p.numel() for p in b.parameters()) for b in blocks), default=0),
            min((sum(p.numel() for p in b.parameters() if p.requires_grad) for b in blocks), default=0))


def stage_numels(model: nn.Module, stages: int, *, trainable: bool = False) -> list[int]:
    """Parameter elements each pipeline stage of the uniform split owns (a parameter shared within a stage
    once; one tied across stages in each stage that holds a copy); ``trainable``: those that get gradients."""
    return [sum(p.numel() for p in owned.values() if p.requires_grad or not trainable)
            for owned in stage_params(model, stages)]


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def pipeline_bounds(c: ParallelConfig, fig: BlockFigures, numels: list[int], blocks: int, f,
                    trainable: list[int] | None = None, gpu=None, regathered: int = 0,
                    block: tuple[int, int] = (0, 0)) -> PipelineBounds:
    """The lower bounds of the module docstring for candidate ``c``, with or without a pipeline
    (``numels``: per stage, from ``stage_numels``, and ``trainable`` those of them that get gradients
    (None: all); ``blocks``: the model's; ``f``: the step-time model's fractions; ``gpu``: the GPU, for
    FSDP's collectives, the pipeline's last reduce-scatter and without a pipeline its communication
    stream (None: not counted); ``regathered``: the elements of the blocks' parameters but the largest
    block's (``regathered``), gathered again in the backward where FSDP reshards after the forward;
    ``block``: the least block's elements and trainable elements (``least_block``), which price FSDP2's
    gather and reduce-scatter of one block)."""
    trainable = numels if trainable is None else trainable
    # bf16 without data parallelism runs under one autocast region over the step, whose casts of the weights
    # the micro-batches share: the block's saved bytes (one micro-batch, casts included) count once at a time
    autocast = c.dp * c.cp == 1 and c.mixed_precision == "bf16"
    k = c.stages
    spr = k // c.pp
    m = c.microbatches if c.pp > 1 else c.accumulation     # without a pipeline: its micro-steps, one at a time
    full = [len(r) for r in stage_blocks(blocks, k)]
    counts = full[:-1] + [max(0, full[-1] - 1)]     # the model's last block: its output may be the norm's to save
    orders = rank_orders(c.schedule, k, m, spr)
    master = _itemsize(c.model_dtype)
    compute = _itemsize(c.param_dtype or c.model_dtype)
    fixed = fig.workspaces + (NCCL_BYTES_PER_COMMUNICATOR * len(c.mesh_shape) if fig.nccl else 0)
    # the gradients a stage accumulates over its micro-batches, unsharded (FSDP2 reduces them after the last
    # backward): in the reduce dtype (or the model's, the smaller) with FSDP, else in the model's dtype
    shards = c.fsdp * c.cp          # FSDP's degree: over dp_shard x cp under context parallel (torchtitan's)
    grad = min(_itemsize(c.reduce_dtype), master) if c.dp * c.cp > 1 else master
    peak, worst = 0, 0
    for r, acts in enumerate(orders):
        mine = sorted({a.stage for a in acts})
        state = 0
        for st in mine:
            shard = numels[st] // (c.tp * shards)
            if not c.offload:
                state += int(shard * master * (1 + fig.optimizer_ratio))
            if shards > 1 and not c.reshard_after_forward and spr == 1:
                state += numels[st] // c.tp * compute
        held: set = set()
        most = grads = 0
        backwards = {st: sum(1 for a in acts if a.stage == st and a.kind == "B") for st in mine}
        done = dict.fromkeys(mine, 0)
        for a in acts:
            key = (a.stage, a.microbatch)
            if a.kind == "F":
                held.add(key)
            else:
                held.discard(key)
            if a.kind == "B" and spr == 1 and c.pp > 1:
                done[a.stage] += 1
                if done[a.stage] == 1 < backwards[a.stage]:         # from its first backward to its last
                    grads += trainable[a.stage] // c.tp * grad
                elif done[a.stage] == backwards[a.stage] > 1:
                    grads -= trainable[a.stage] // c.tp * grad
            each = [counts[st] * fig.saved for st, _ in held]
            most = max(most, grads + (max(each, default=0) if autocast else sum(each)))
        total = fixed + state + most
        if total > peak:
            peak, worst = total, r
    step = None
    if fig.one_role and (c.cp == 1 or c.pp == 1):
        # under context parallel each place in the ring is a role of its own (simulate/results.py ``roles``):
        # without a pipeline the step is the slowest role's, no shorter than rank 0's, whose figures these
        # are; with one the schedule takes each stage's slowest role, whose compute may be another's
        where = stage_ranks(c.schedule, k, spr)
        opt = [0.0 if c.offload else fig.optimizer_per_byte * master
               * sum(numels[st] // (c.tp * shards) for st in range(k) if where[st] == r) for r in range(c.pp)]
        reduce = ([reduce_seconds(trainable[st], c, gpu, f, grad) for st in range(k)]
                  if gpu is not None and c.pp > 1 and shards > 1 else None)
        stream = (max(stream_seconds(numels[0], trainable[0], regathered, c, gpu, f, compute, grad),
                      chain_seconds(c, fig, blocks, *block, gpu, f, compute, grad))
                  if gpu is not None and c.pp == 1 else 0.0)
        step = step_bound(c, fig, full, opt, f, reduce, stream)
    return PipelineBounds(peak, step, worst, activations=fig.saved > 0)
