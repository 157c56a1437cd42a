"""The step time of a sharded-training configuration on GPUs, predicted from its simulated ranks.

Compute: every op a simulated rank ran (its last step: forward, loss, backward, the recompute of
checkpointed blocks in the backward, each micro-batch of an accumulation or a pipeline) is priced by a
roofline, ``max(FLOPs / (peak x fraction), bytes moved / (HBM bandwidth x fraction))``, with a floor of
one kernel launch. The peaks are the GPU table's (costs/gpus.py) for the dtype the configuration
computes in (bf16 under mixed precision; float32 matmuls without TF32 otherwise); the fractions are
what such kernels reach, by op class (``FRACTIONS``, overridable per run; the H100 figures were
measured by bench/bench_gpu.py, torch 2.11, docs/benchmarks.md):

* ``matmul`` 0.75 -- contractions (every op with multiply-accumulates: mm, addmm, bmm, linear,
  convolution): bf16 GEMMs of a 0.5B Llama's shapes ran at 0.73-0.79 of an H100's 989 TFLOP/s (a
  4096 x 1024 x 2816 one at 0.50);
* ``attention`` 0.70 -- SDPA's fused kernels (flash, cuDNN, memory-efficient), forward and backward:
  the fraction of the peak forward kernels at a head-dim tile of 128 reach on their padded work, the rest
  scaled by what each tile measured (``attention_seconds``; until 2026-11-26 this was a flat fraction of
  the executed FLOPs, 0.40: an override of 0.2, once advised for GPT-2, now prices attention 3.5 times
  slower than the default, so drop it): a kernel runs the scores its mask keeps (a causal mask counted
  dense, the cost convention, is priced by its kept scores, ``OpEvent.executed``) plus a fixed cost per
  query row, each at the head dims of its tile (80 and 96 run as 128), and with
  dropout a random number per kept score. cuDNN's kernels on an H100 over 40 shapes (head dims 64-256,
  512-4,096 tokens, causal or not) are within 5-7% rms of this (at most 20% off, at 512 tokens), and 10
  more with dropout within 10%; a flat fraction of the FLOPs missed heads of 64 and short sequences by
  up to 3x, and dropout's forwards by half;
* ``memory`` 0.68 -- of the HBM bandwidth, for everything else (elementwise, norms, casts, copies): a
  large add streams at 0.91, but a training step's mix of them (broadcast multiplies, mixed-dtype ops,
  casts at 0.59, norms at 0.83) at 0.65-0.78 (0.675 the median of 13 bf16 whole steps' memory-bound
  kernels over their bytes, Llamas and GPT-2s on an H100; 3 held-out Llamas at 0.67-0.68);
* ``link`` 0.80 -- of a link's bandwidth, for collectives: NCCL's bus bandwidth on NVLink and
  InfiniBand reaches 75-90% of the wire at the message sizes of a training step;
* ``launch_s`` 4 us -- the least a kernel takes (launch and tail), so thousands of small ops are not free;
* ``host_op_s`` 27 us, ``host_tp_op_s`` 64 us, ``host_sac_op_s`` 48 us -- the host's time to issue one op
  (a view too) in eager mode: plain dispatch with FSDP2's hooks and transformers' modules; every op
  under tensor parallel (DTensor's dispatch); every op under selective checkpointing (its policy's
  dispatch mode). Measured as an eager step's issue time over its op count on the H100's host (Llama
  rows: 27-29 us plain and with full checkpointing, 48 selective, 60-64 with TP 2; GPT-2's ran at 35-52
  and 68-78). Under torch.compile, fewer and fused kernels: set them lower.

An op that no cost formula counts (``status`` "uncounted") costs one launch: its count is in the
result (``uncounted_ops``) and a note, never a silent zero.

Communication: a collective's seconds are what a ring moves through each rank (``results.Collective``:
(n - 1) / n of the gathered or reduced bytes, twice that for an all-reduce) over the group's slowest
link, plus ``n - 1`` hops of latency: NVLink (``GPU.nvlink``) when the group lies within a node, the
network (``GPU.network``) when it spans nodes. The mesh is ``[pp, replicate, fsdp, tp]`` with tp
innermost, so a group of stride ``s`` and size ``n`` lies within a node when ``s x n`` is at most
``gpus_per_node``.

Overlap, per rank, as two streams over the ops in program order (the order the CPU issues them):
* the host issues every op in order, one ``host_op_seconds`` each; no kernel or collective starts
  before it is issued, so a step of small kernels is the host's (``host_wait``: the GPU idle waiting);
* compute runs every op in order;
* FSDP2's all-gathers run on a communication stream, each issued when the compute of the block before
  its block starts (FSDP2's prefetch of the next block, forward and backward), and the block's compute
  waits for it; its reduce-scatters (and HSDP's all-reduce across replicas) run on the same stream after
  the block's backward, the compute going on; the optimizer waits for every one;
* tensor parallel's collectives are on the critical path: the compute waits for each; so are expert
  parallel's all-to-alls (the token count exchange, dispatch and combine, and their backward), counted
  with them in ``tp_comm``, priced over the ep group's link (ep innermost on the sparse mesh: NVLink when
  ``ep`` is at most ``gpus_per_node``), what crosses it the larger of the bytes sent and received less
  the rank's own share (``results.collective_group``).
The exposed communication is the step time less the compute.

Pipeline (pp > 1): each stage's forward and backward seconds per micro-batch (its stage rank's ops,
including its tensor parallel's collectives, divided by the micro-batches), the send of a
micro-batch's activation across each cut (``Collective`` "send" bytes over the pp link), and after
its last backward each rank's exposed FSDP communication (its all-gathers beyond its compute, its
reduce-scatters after the last backward, as torch's schedule reduces) and its optimizer step go
through the schedule's own simulation (planning/steptime/schedule.py ``simulate``), which gives the bubble.
Where a rank holds several stages (interleaved schedules) its seconds are shared among them evenly.

The optimizer: torch's foreach updates (its default on CUDA) are memory-bound passes over
parameter-sized tensors, at the ``memory`` fraction of the bandwidth: AdamW's eight foreach ops read and
write 20 of them (lerp_ 3, mul_ 2, addcmul_ 3, sqrt 2, div_ 2, add_ 2, addcdiv_ 4, the weight decay's
mul_ 2), SGD with momentum's three 8, plain SGD's one 3 (chosen by the state's tensors per parameter).
On the H100 AdamW's foreach kernels of a 66M-parameter shard took 2.03 ms; this prices 2.33 ms (they
stream at 0.78, faster than the step's mix).

MFU: the model's FLOPs per step (three times the forward's contractions and attention: the backward's
two, no recompute, as PaLM's MFU counts them) over the step time and the world's peak.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

from ...costs.gpus import GPU
from ...errors import InputError
from ..config import ParallelConfig
from ...trace import BACKWARD, FORWARD, LOSS
from ..simulate.results import COLLECTIVES, collective_group, ring_op

__all__ = ["FRACTIONS", "RankSeconds", "StepTime", "assemble", "attention_seconds", "collective_seconds",
           "fractions", "host_op_seconds", "link_of", "op_class", "op_seconds", "optimizer_seconds",
           "rank_seconds", "send_bytes", "step_time"]

FRACTIONS: Mapping[str, float] = MappingProxyType({"matmul": 0.75, "attention": 0.70, "memory": 0.68,
                                                   "link": 0.80, "launch_s": 4e-6, "nvlink_latency_s": 3e-6,
                                                   "network_latency_s": 8e-6, "host_op_s": 27e-6,
                                                   "host_tp_op_s": 64e-6, "host_sac_op_s": 48e-6})
# Fused attention (cuDNN's SDPA kernels on an H100, bf16, torch 2.11: bench/bench_gpu.py part 7, 40 shapes,
# head dims 64-256, lengths 512-4,096, causal and not, forward and backward). A kernel's time is its padded
# work: the scores it runs (the kept ones, op.executed) plus a fixed cost per query row, in scores
# (_ATTENTION_ROWS, by backward and masked: the tile loop's prologue and epilogue, and under a causal mask
# the diagonal tiles it runs whole), each score at the head dims of the kernel's tile (_tile: a head of 80
# or 96 runs as 128; heads of 32, 160 or 192 were not timed, and run at the tiles around them).
# That work runs at the attention fraction of the peak (0.70: forward at tile 128) times its tile's
# measured rate relative to that (_ATTENTION_SCALE: forward 0.475 / 0.70 / 0.745 of the peak at tiles 64 /
# 128 / 256, backward 0.455 / 0.615 / 0.46; the product is at most 1, the peak). Against the 40 shapes:
# 5.6% rms and at most 20% off (forward), 6.7% and 17% (backward); the largest misses at 512 tokens.
# Timed on cuDNN's kernels, which an H100 runs; flash (an A100's) and the memory-efficient kernel are
# priced alike, untimed.
_ATTENTION_ROWS = {(False, False): 160, (False, True): 320, (True, False): 448, (True, True): 544}
_ATTENTION_SCALE = {(False, 64): 0.68, (False, 128): 1.0, (False, 256): 1.06,
                    (True, 64): 0.65, (True, 128): 0.88, (True, 256): 0.66}
# Dropout in the kernel (a random number per kept score; GPT-2's attention trains with 0.1): 1.03 ps a
# score forward (0.91-1.18) and 0.66 backward (0.49-0.82) more on the H100, whatever the head dim (10
# shapes, heads of 64 and 128, 1,024-4,096 tokens, causal or not), which doubles a forward. Kept here as
# the work of that many FLOPs at the H100's float32 peak (67e12: the CUDA cores draw them, not the
# tensor cores), so a GPU's own float32 peak scales it
_DROPOUT_WORK = {False: 69.0, True: 44.2}

# torch's foreach optimizers (their default on CUDA) stream parameter-sized tensors this many times per
# step, by the optimizer's state tensors per parameter (the module docstring counts them)
_OPTIMIZER_PASSES = {0: 3, 1: 8, 2: 20}

_FSDP_GATHER = frozenset(k for k, (kind, group) in COLLECTIVES.items() if group == "fsdp" and kind == "all-gather")
_BEHIND = frozenset(k for k, (kind, group) in COLLECTIVES.items()
                    if group in ("fsdp", "replicate") and kind != "all-gather")     # reduce-scatter, HSDP all-reduce
_INLINE = frozenset(k for k, (_, group) in COLLECTIVES.items() if group == "tp")


def fractions(overrides: Mapping[str, float] | None = None) -> Mapping[str, float]:
    """``FRACTIONS`` with any entry replaced (a fraction in (0, 1], a time or latency >= 0)."""
    out = dict(FRACTIONS)
    for k, v in (overrides or {}).items():
        if k not in FRACTIONS:
            raise InputError(f"unknown step-time fraction {k!r}; known: {', '.join(FRACTIONS)}")
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and (
            0 <= v if k.endswith("_s") else 0 < v <= 1)
        if not ok:
            raise InputError(f"step-time fraction {k} must be " + ("a number of seconds >= 0" if k.endswith("_s")
                                                                    else "in (0, 1]") + f", got {v!r}")
        out[k] = float(v)
    return MappingProxyType(out)


def _compute_dtype(config: ParallelConfig) -> str:
    if config.mixed_precision == "bf16":
        return "bfloat16"
    import torch
    return {torch.bfloat16: "bfloat16", torch.float16: "float16"}.get(config.model_dtype, "float32")


def op_class(op) -> str:
    """The class an op is priced as: "free" (a view, a profiler mark), "attention" (SDPA's fused
    kernels), "matmul" (an op with multiply-accumulates) or "memory" (the rest)."""
    if op.status == "free" or op.op.startswith("profiler."):     # views; the profiler's record_function marks
        return "free"
    if "attention" in op.op or "flash" in op.op:
        return "attention"
    return "matmul" if op.costs.macs else "memory"


def _tile(d: int) -> int:
    """The head dim a fused attention kernel computes at: its tile's (64, 128, 256; then whole 64s)."""
    return 64 if d <= 64 else 128 if d <= 128 else 256 if d <= 256 else -(-d // 64) * 64


def attention_seconds(op, gpu: GPU, dtype: str, f: Mapping[str, float]) -> float:
    """A fused attention kernel's seconds: its padded work (the model above ``_ATTENTION_ROWS``) at the
    attention fraction of the peak, scaled by its tile's measured rate, plus a launch; with dropout, its
    random numbers (``_DROPOUT_WORK``). Without its shape (an op whose formula gives none, such as
    nn.MultiheadAttention's fused inference op), its executed FLOPs at the rate of head dim 128."""
    a = op.attention
    backward = a.backward if a is not None else op.phase == BACKWARD
    extra = 0.0
    if a is None:
        work = op.costs.flops * op.executed
        scale = _ATTENTION_SCALE[backward, 128]
    else:
        per_score = 3 * a.head_dim + 2 * a.value_dim if backward else a.head_dim + a.value_dim
        scores = op.costs.macs / per_score if per_score else 0.0
        kept = scores * op.executed + a.rows * _ATTENTION_ROWS[backward, a.masked]
        dp, dvp = _tile(a.head_dim), _tile(a.value_dim)
        work = 2 * kept * ((3 * dp + 2 * dvp) if backward else (dp + dvp))
        scale = _ATTENTION_SCALE[backward, min(_tile(max(a.head_dim, a.value_dim)), 256)]
        if a.dropout:       # random numbers on the CUDA cores: at the float32 (not tensor-core) peak
            extra = scores * op.executed * _DROPOUT_WORK[backward] / gpu.peak("float32")
    return work / (gpu.peak(dtype) * min(1.0, f["attention"] * scale)) + extra + f["launch_s"]


def op_seconds(op, gpu: GPU, dtype: str, f: Mapping[str, float]) -> float:
    """One op's roofline seconds (0 for a view or other free op)."""
    kind = op_class(op)
    if kind == "free":
        return 0.0
    c = op.costs
    memory = c.bytes_moved / (gpu.bandwidth * f["memory"])
    if kind == "memory":
        compute = c.flops / gpu.peak("float32")
    elif kind == "attention":
        return max(attention_seconds(op, gpu, dtype, f), memory)
    else:
        compute = c.flops / (gpu.peak(dtype) * f[kind])
    return max(compute, memory, f["launch_s"])


def host_op_seconds(config: ParallelConfig, f: Mapping[str, float]) -> float:
    """The host's time to issue one op (a view too) in eager mode: DTensor's dispatch under tensor
    parallel, selective checkpointing's policy on every op, or plain dispatch with FSDP2's hooks."""
    if config.tp > 1:
        return max(f["host_tp_op_s"], f["host_sac_op_s"] if config.ac == "selective-op" else 0.0)
    return f["host_sac_op_s"] if config.ac == "selective-op" else f["host_op_s"]


def optimizer_seconds(run, gpu: GPU, f: Mapping[str, float]) -> float:
    """The optimizer step of a rank: ``_OPTIMIZER_PASSES`` parameter-sized passes (by its state tensors
    per parameter) at the memory fraction of the bandwidth."""
    params = sum(run.param_bytes.values())
    if not params:
        return 0.0
    k = round(sum(run.optimizer_bytes.values()) / params)
    return _OPTIMIZER_PASSES.get(k, 4 + 8 * k) * params / (gpu.bandwidth * f["memory"])


def link_of(config: ParallelConfig, group: str) -> tuple[str, int]:
    """("nvlink", 1) when every group of this mesh dimension lies within a node; else ("network", g),
    ``g`` the group's members on each node (each with its own NIC)."""
    # the mesh [pp, replicate, dp_shard, cp, tp]: FSDP's group is dp_shard x cp under context parallel; ep is
    # innermost on the sparse mesh (dp_replicate, efsdp, ep), its ranks consecutive (expert_parallel.py)
    cp = config.cp
    inner = {"tp": 1, "ep": 1, "cp": config.tp, "fsdp": config.tp, "replicate": config.tp * config.fsdp * cp,
             "pp": config.tp * config.fsdp * cp * config.replicate}[group]
    size = {"tp": config.tp, "ep": config.ep, "cp": cp, "fsdp": config.fsdp * cp, "replicate": config.replicate,
            "pp": 2}[group]
    if inner * size <= config.gpus_per_node:
        return "nvlink", 1
    return "network", max(1, config.gpus_per_node // inner)


def collective_seconds(ring_bytes: float, n: int, link, gpu: GPU, f: Mapping[str, float]) -> float:
    """A ring collective of ``n`` ranks moving ``ring_bytes`` through each rank over ``link`` (``link_of``'s
    pair, or a link's name). Across nodes, what enters a node from outside enters it once, through the
    NICs of the group's members there, and goes on within the node over NVLink (NCCL's rings over the
    rails of one NIC per GPU): ``g`` members a node share the ring's bytes over ``g`` NICs, up to NVLink's
    own bandwidth."""
    if n <= 1:
        return 0.0
    name, per_node = (link, 1) if isinstance(link, str) else link
    bw = gpu.nvlink if name == "nvlink" else gpu.network
    if bw <= 0:
        raise InputError(f"the GPU {gpu.name} has no {name} bandwidth in the table: give it (gpu={gpu.name!r} "
                         f"with {name}=bytes/s)")
    if name == "network":
        bw = min(bw * per_node, gpu.nvlink or bw * per_node)
    return ring_bytes / (bw * f["link"]) + (n - 1) * f[f"{name}_latency_s"]


def _one_collective(op, config: ParallelConfig, gpu: GPU, f, in_ring: bool = False) -> float:
    kind, group, n, whole = collective_group(op.op, op.costs.bytes_read, op.costs.bytes_written, config, in_ring)
    if group == "replicate" and config.replicate == 1:     # outside HSDP the data-parallel ranks are FSDP's
        group = "fsdp"
    ring = whole * (n - 1) / max(n, 1) * (2 if kind == "all-reduce" else 1)
    if in_ring and kind == "all-to-all":      # the ring's permute: a rank sends all it reads to the next
        ring = op.costs.bytes_read
    return collective_seconds(ring, n, link_of(config, group), gpu, f)


@dataclass(frozen=True, slots=True)
class RankSeconds:
    """One simulated rank's last step: seconds by what they went to."""

    forward: float            # compute of forward ops (and the loss), every micro-batch
    backward: float           # compute of backward ops (recompute included)
    host_forward: float       # the GPU idle, waiting for the host to issue ops, in the forward
    host_backward: float      # and in the backward
    tp: float                 # tensor parallel's collectives (on the critical path)
    fsdp: float               # FSDP's (and HSDP's) collectives, all of them
    exposed_fsdp: float       # of those, what the compute did not hide
    optimizer: float
    end: float                # the two streams' end, before the optimizer
    uncounted_ops: int
    forward_flops: int        # FLOPs of the forward's contractions and attention (not the recompute)
    cp: float = 0.0           # context parallel's ring collectives (on the critical path)


def rank_seconds(rr, config: ParallelConfig, gpu: GPU, f: Mapping[str, float], *, micro: int | None = None
                 ) -> RankSeconds:
    """The two-stream walk over one simulated rank's last step (the module docstring); ``micro``: only
    its first ``micro`` passes (micro-steps of an accumulation), the optimizer still after them."""
    dtype = _compute_dtype(config)
    run = rr.run
    last = max((p.step for p in run.passes), default=0)
    per_op = host_op_seconds(config, f)
    tc = tn = issue = host = 0.0
    fwd = bwd = tp = fsdp = cp = 0.0
    wait = {FORWARD: 0.0, BACKWARD: 0.0}
    uncounted = 0
    fflops = 0
    for p in run.passes:
        if p.step != last or (micro is not None and p.micro >= micro):
            continue
        for op in p.trace.ops:
            host += per_op              # the host issues every op, a view too, in program order
            if op.op in COLLECTIVES:
                in_ring = ring_op(rr, p, op)
                d = _one_collective(op, config, gpu, f, in_ring)
                if in_ring or op.op in _INLINE:
                    # on the critical path, the compute waiting for each: tensor parallel's collectives, and
                    # context parallel's ring (each attention waits for its K/V: the forward's all-gather
                    # before its second chunk, the backward's gradient pass before the next step), with no
                    # overlap credited (an upper bound)
                    if host > tc:
                        wait[BACKWARD if op.phase == BACKWARD else FORWARD] += host - tc
                        tc = host
                    tc += d
                    if in_ring:
                        cp += d
                    else:
                        tp += d
                elif op.op in _FSDP_GATHER:
                    start = max(tn, issue, host)
                    tn = start + d
                    tc = max(tc, tn)
                    issue = tc
                    fsdp += d
                elif op.op in _BEHIND:
                    tn = max(tn, tc, host) + d
                    fsdp += d
                continue
            if op.status == "uncounted" and not op.op.startswith("profiler."):
                uncounted += 1
            d = op_seconds(op, gpu, dtype, f)
            if d and host > tc:         # the GPU waits for the host to issue this kernel
                wait[BACKWARD if op.phase == BACKWARD else FORWARD] += host - tc
                tc = host
            tc += d
            if op.phase in (FORWARD, LOSS):
                fwd += d
                if op.phase == FORWARD and op_class(op) in ("matmul", "attention"):
                    fflops += op.costs.flops
            elif op.phase == BACKWARD:
                bwd += d
    end = max(tc, tn)
    opt = optimizer_seconds(run, gpu, f)
    exposed = max(0.0, end - (fwd + bwd + tp + cp + wait[FORWARD] + wait[BACKWARD]))
    return RankSeconds(fwd, bwd, wait[FORWARD], wait[BACKWARD], tp, fsdp, exposed, opt, end, uncounted, fflops, cp)


@dataclass(frozen=True, slots=True)
class StepTime:
    """A configuration's predicted step: seconds, and where they went on the slowest rank."""

    step_time: float
    compute: float            # forward + backward (recompute included) + the optimizer
    host_wait: float          # the GPU idle, waiting for the host to issue the next op (eager dispatch)
    tp_comm: float            # tensor parallel's collectives, on the critical path
    exposed_comm: float       # FSDP/HSDP communication the compute did not hide, and pipeline sends
    bubble: float             # a pipeline's idle share of its ranks' time (0 without one)
    tokens_per_s: float | None
    mfu: float | None
    uncounted_ops: int
    gpu: str
    fractions: Mapping[str, float]
    cp_comm: float = 0.0      # context parallel's ring collectives, on the critical path

    def to_dict(self) -> dict:
        # cp_comm only under context parallel (a plan's JSON without it is as it was)
        return {"step_time": self.step_time, "compute": self.compute, "host_wait": self.host_wait,
                "tp_comm": self.tp_comm, **({"cp_comm": self.cp_comm} if self.cp_comm else {}),
                "exposed_comm": self.exposed_comm, "bubble": self.bubble, "tokens_per_s": self.tokens_per_s,
                "mfu": self.mfu, "uncounted_ops": self.uncounted_ops, "gpu": self.gpu,
                "fractions": dict(self.fractions)}


def send_bytes(runs: Mapping[int, object]) -> float:
    """The largest bytes one pipeline transfer carries (0 without a pipeline)."""
    return max((rr.p2p[0] / rr.p2p[2] for rr in runs.values() if rr.p2p is not None and rr.p2p[2]), default=0.0)


def step_time(runs: Mapping[int, object], config: ParallelConfig, gpu: GPU, *, tokens: int | None,
              f: Mapping[str, float] | None = None) -> StepTime:
    """The step time of ``config`` from its simulated ranks (``runs``: representative global rank ->
    RankRun; ranks of one pipeline stage are in lock step with their collectives, so a stage is its
    slowest role). ``tokens``: tokens of the global batch per step (None: no tokens/s)."""
    f = f or FRACTIONS
    return assemble({r: rank_seconds(rr, config, gpu, f) for r, rr in runs.items()}, send_bytes(runs), config, gpu,
                    tokens=tokens, f=f)


def assemble(secs: Mapping[int, RankSeconds], send: float, config: ParallelConfig, gpu: GPU, *, tokens: int | None,
             f: Mapping[str, float]) -> StepTime:
    """The step from each role's seconds (``rank_seconds``) and a pipeline transfer's bytes."""
    world_flops = gpu.peak(_compute_dtype(config)) * config.world
    uncounted = max((x.uncounted_ops for x in secs.values()), default=0)
    if config.pp == 1:
        s = max(secs.values(), key=lambda x: x.end + x.optimizer)
        total = s.end + s.optimizer
        model_flops = 3 * s.forward_flops * config.world
        return StepTime(total, s.forward + s.backward + s.optimizer, s.host_forward + s.host_backward, s.tp,
                        s.exposed_fsdp, 0.0,
                        tokens / total if tokens and total else None,
                        model_flops / (total * world_flops) if total else None, uncounted, gpu.name, f,
                        getattr(s, "cp", 0.0))
    from .schedule import simulate
    per_stage = config.world // config.pp
    stage_of: dict[int, RankSeconds] = {}
    for r, s in secs.items():                   # each pipeline rank: its slowest role
        c = r // per_stage
        if c not in stage_of or s.end > stage_of[c].end:
            stage_of[c] = s
    k = config.stages
    spr = k // config.pp
    m = config.microbatches
    fw, bw, opt = [0.0] * k, [0.0] * k, [0.0] * k
    for c, s in stage_of.items():
        busy = max(s.forward + s.backward, 1e-30)
        for st in (c + i * config.pp for i in range(spr)):     # stage st on rank st % pp
            fw[st] = (s.forward + s.host_forward + s.tp * s.forward / busy) / (m * spr)
            bw[st] = (s.backward + s.host_backward + s.tp * s.backward / busy) / (m * spr)
        opt[c] = s.exposed_fsdp + s.optimizer
    hop = collective_seconds(send, 2, link_of(config, "pp"), gpu, f) if send else 0.0
    tl = simulate(config.schedule, fw, bw, m, send=[hop] * (k - 1), optimizer=opt, stages_per_rank=spr)
    total = tl.step_time
    slowest = max(stage_of.values(), key=lambda x: x.forward + x.backward)
    model_flops = 3 * sum(x.forward_flops for x in stage_of.values()) * per_stage
    return StepTime(total, max(x.forward + x.backward + x.optimizer for x in stage_of.values()),
                    max(x.host_forward + x.host_backward for x in stage_of.values()), slowest.tp,
                    max(x.exposed_fsdp for x in stage_of.values()) + hop * 2 * m, tl.bubble,
                    tokens / total if tokens and total else None,
                    model_flops / (total * world_flops) if total else None, uncounted, gpu.name, f)
