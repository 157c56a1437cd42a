"""The planning configuration: the one table of pipeline schedules, the options of a pipeline split
(``PartitionOptions``) and one sharded-training configuration (``ParallelConfig``). Code branches on a
schedule's fields, never on its name: adding a schedule is one entry of ``SCHEDULES``."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable, Literal

import torch

from ..errors import InputError
from ..options import check_choice, opt, parse_dtype_name
from .orders import (all_held, forwards_then_backwards, held_to_weight, spread_warmup_held, torch_rank_order, warmup_held, warmup_then_alternate)

__all__ = ["PipelineSchedule", "SCHEDULES", "schedule_of", "default_schedule", "PartitionOptions", "LAUNCHER_FIELDS", "ParallelConfig",
           "AcMode", "Precision"]


# --- pipeline schedules: one table; code branches on these fields, never on a schedule's name ----

@dataclass(frozen=True, slots=True)
class PipelineSchedule:
    """One of torch.distributed.pipelining's schedules as the planner, the simulation, the search and the
    runs see it. Adding a schedule is one entry of ``SCHEDULES``: its fields say how it runs (the
    behaviours ``order`` and ``held`` name are in planning/orders.py; a runtime schedule names torch's
    per-rank order builder in ``rank_ops``, a key of ``_compat.schedule_order``'s table)."""

    name: str
    torch_class: str              # in torch.distributed.pipelining
    order: Callable               # how a rank orders its actions: (kind, stages, micro-batches, stages per
    #                               rank) -> per rank its (stage, "F" | "B" | "I" | "W", micro-batch) actions
    held: Callable                # micro-batches a stage holds at once: (kind, stages, micro-batches,
    #                               stage, stages per rank) -> count
    multi: bool = False           # several stages on each rank: torch's runtime schedule, whose lowering
    #                               all-gathers, reshards and reduces per stage (_compat.runtime_lowered) and
    #                               keeps every send, outputs included, to the step's end
    keeps_sends: bool = True      # a stage keeps what it sent (outputs, input gradients) until the step
    #                               ends; False: each action's send ops replace the last's (one input
    #                               gradient held, the warm-up's last output but one)
    zero_bubble: bool = False     # each backward split into I (the input's gradient) and W (weights')
    v_shape: bool = False         # stages placed in a V (rank r owns r and 2P - 1 - r), else in a loop
    fixed_per_rank: int | None = None   # stages per rank the schedule fixes (zbv: 2)
    min_per_rank: int = 1         # the fewest stages per rank it takes (interleaved: 2)
    rounds: bool = False          # torch runs the micro-batches in rounds of the ranks' count
    export_stages: bool = True    # torch.export stages connect under it (zbv's V: not, torch 2.13)
    label: str = ""               # how error messages name it
    rank_ops: str | None = None   # a runtime schedule: torch's per-rank order builder (_compat.schedule_order)
    searched: bool = False        # the parallel search tries it (planning/search)

    def per_rank(self, stages_per_rank: int) -> int:
        """Stages on each rank."""
        return (self.fixed_per_rank or stages_per_rank) if self.multi else 1

    def ranks(self, stages: int, stages_per_rank: int) -> int:
        return stages // max(1, self.per_rank(stages_per_rank))

    def check_stages(self, stages: int, stages_per_rank: int, flag: str = "stages",
                     of: str = "stages_per_rank") -> None:
        """That ``stages`` stages can be placed: a multiple of the stages on each rank (``flag`` and
        ``of``: how the message names the two, as the caller took them)."""
        if not self.multi:
            return
        f = self.fixed_per_rank
        if f is not None and stages_per_rank != f:
            raise InputError(f"the {self.name} schedule puts exactly {f} stages on each rank: leave {of} at {f} "
                             f"(got {stages_per_rank})")
        if f is not None and stages % f:
            raise InputError(f"the {self.name} schedule puts exactly {f} stages on each rank: {flag} ({stages}) must "
                             "be " + ("even" if f == 2 else f"a multiple of {f}"))
        if f is None and (stages_per_rank < self.min_per_rank or stages % stages_per_rank):
            raise InputError(f"the {self.name} schedule puts {stages_per_rank} stages on each rank: {flag} "
                             f"({stages}) must be a multiple of {of}"
                             + (f" (at least {self.min_per_rank})" if self.min_per_rank > 1 else ""))

    def rank_order(self, rank: int, stages_per_rank: int, ranks: int, microbatches: int) -> list:
        """The (stage, kind, micro-batch) actions rank ``rank`` runs, in torch's own order (runtime schedules)."""
        from .._compat import schedule_order
        return schedule_order(self, rank, stages_per_rank, ranks, microbatches)

    def torch_schedule(self):
        import torch.distributed.pipelining as pp
        return getattr(pp, self.torch_class)


SCHEDULES: dict[str, PipelineSchedule] = {s.name: s for s in (
    PipelineSchedule("gpipe", "ScheduleGPipe", forwards_then_backwards, all_held),
    PipelineSchedule("1f1b", "Schedule1F1B", warmup_then_alternate, warmup_held, keeps_sends=False, searched=True),
    PipelineSchedule("interleaved", "ScheduleInterleaved1F1B", torch_rank_order, spread_warmup_held, multi=True,
                     min_per_rank=2, rounds=True, label="interleaved 1F1B", rank_ops="interleaved_rank_ops",
                     searched=True),
    PipelineSchedule("zb", "ScheduleInterleavedZeroBubble", torch_rank_order, held_to_weight, multi=True,
                     zero_bubble=True, rounds=True, label="interleaved zero bubble", rank_ops="zb_rank_ops"),
    PipelineSchedule("zbv", "ScheduleZBVZeroBubble", torch_rank_order, held_to_weight, multi=True,
                     zero_bubble=True, v_shape=True, fixed_per_rank=2, export_stages=False, label="ZBV zero bubble",
                     rank_ops="zbv_rank_ops"),
)}


def schedule_of(name) -> PipelineSchedule:
    """The schedule named ``name`` (or ``name`` itself, a PipelineSchedule); one clear error otherwise."""
    if isinstance(name, PipelineSchedule):
        return name
    found = SCHEDULES.get(name) if isinstance(name, str) else None
    if found is None:
        raise InputError(f"schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")
    return found


def default_schedule() -> str:
    """The schedule a configuration takes when none is given (``ParallelConfig``'s default): what a
    configuration without a pipeline carries."""
    return next(f.default for f in fields(ParallelConfig) if f.name == "schedule")


# --- partition, split --run and the torchrun launcher: one options object -----------------------

@dataclass(frozen=True, slots=True)
class PartitionOptions:
    """Every option of ``partition()``, ``layerscope split`` and ``torchrun.launch()``: the entry
    points take the few most calls use as keywords and the rest here (or as keywords, pulled in by
    ``entry_options``); everything below them takes this object. The launcher's own fields (from
    ``overrides`` on) say how every rank builds the model from its spec and trains it."""

    # each field once; those with a help are `layerscope split`'s flags (cli/flags.py), the help derived here
    stages: int | None = opt(None, least=1, required=True, help="number of pipeline stages")
    by: Any = opt("flops", choices=("flops", "macs", "params", "memory", "latency", "roofline"),   # or a callable
                  help="the stage cost (default flops, forward + backward); latency: forward and backward\n"
                       "times measured here (real weights), roofline: predicted from FLOPs and bytes\n"
                       "(--roofline): with either the plan predicts the step time and draws the step")
    memory_limit: Any = opt(None, help="per-stage memory limit such as 16GiB")   # bytes, "16GiB", or one per stage
    schedule: str = opt("1f1b", choices=tuple(SCHEDULES),
                        help="pipeline schedule (default 1f1b), as torch's classes:\n" + "\n".join(
                            f"  {k}: {v.torch_class}" + (f" ({v.fixed_per_rank} stages per rank in a V)"
                                                         if v.v_shape else "") for k, v in SCHEDULES.items()))
    microbatches: int = opt(1, least=1, cli_default=4, help="micro-batches the batch is split into (default 4)")
    optimizer: Any = opt(None, cli_default="adamw", help="optimizer whose state each stage holds (default adamw)")
    stages_per_rank: int = opt(2, least=2, help="stages on each rank under --schedule interleaved or zb (default 2; "
                                                "--run starts\nstages / stages-per-rank processes)")
    batch_dim: int = 0
    input_size: Any = None
    dtypes: Any = None
    autocast_dtype: Any = None
    device: Any = opt(None, arg="device", help="the device to plan for (cpu or cuda)")
    latency_repeats: int = 5
    loss_fn: Any = None
    measure_working: bool | None = None
    objective: str | None = opt(
        None, choices=("step_time", "bottleneck", "uniform"),
        help="what the split minimises: step_time (the schedule's simulated step; the default\n"
             "with --by latency or roofline), bottleneck (the largest stage cost; the default\n"
             "otherwise) or uniform (equal repeated blocks per stage: torchtitan's default)")
    roofline: Any = opt(None, metavar="PEAKS",
                        help="peaks for --by roofline: a GPU of the built-in table (H100, A100, ...),\n"
                             "'FLOPS,BYTES_PER_S', or 'measure' (default: measured on this machine on cpu)")
    link_bandwidth: float | None = opt(None, arg="bandwidth", metavar="BYTES_PER_S",
                                       help="price each send across a cut at this bandwidth (e.g. 50e9 or 50GB/s)")
    optimizer_bandwidth: float | None = opt(None, arg="bandwidth", metavar="BYTES_PER_S",
                                            help="price each rank's optimizer step at this memory bandwidth (e.g. "
                                                 "2e12)")
    cuts: Any = None
    return_outputs: bool = opt(True, action="optional", cli_default=None,
                               help="plan for schedule.step(..., return_outputs=True): the last stage keeps every\n"
                                    "micro-batch's output (torch's default, and the default; --no-return-outputs\n"
                                    "plans for step(..., return_outputs=False))")
    count_inputs: bool | None = None
    target_bytes: int = 0
    # the launcher (torchrun): the model from its spec, the run
    overrides: dict | None = None
    head: str | None = None
    input_ids: Any = None
    model_dtype: str | None = None
    allow_pickle: bool = False
    batch_size: int = opt(8, least=1, help="the whole batch, split into micro-batches (default 8: the inputs' batch\n"
                                           "dimension is re-sized to it, also that of --input-ids/--input-size)")
    steps: int = opt(3, least=1, help="training steps for --run (default 3)")
    seed: int = 0
    path: str = "auto"
    timeout: float = 600.0
    compare_grads: bool = False

    def __post_init__(self) -> None:
        schedule_of(self.schedule)

    @property
    def schedule_kind(self) -> PipelineSchedule:
        return SCHEDULES[self.schedule]


# the fields only the torchrun launcher reads
LAUNCHER_FIELDS = ("overrides", "head", "input_ids", "model_dtype", "allow_pickle", "batch_size", "steps", "seed",
                    "path", "timeout", "compare_grads")


# --- sharded training (parallel/): one configuration -------------------------------------------

def _parse_routing(value) -> str:
    """``even`` or ``skew:F`` (F >= 1, the hottest expert's tokens over its even share), normalised."""
    if value == "even":
        return value
    text = str(value)
    kind, _, f = text.partition(":")
    try:
        skew = float(f) if kind == "skew" else None
    except ValueError:
        skew = None
    if skew is None or not skew >= 1 or skew == float("inf"):
        raise InputError(f"routing must be even or skew:F with F >= 1 (the hottest expert's tokens over its even "
                         f"share), got {value!r}")
    return "even" if skew == 1 else f"skew:{skew:g}"


AcMode = Literal["none", "full", "selective-layer", "selective-op"]
Precision = Literal["bf16", "off"]

@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """One sharded-training configuration: how ``gpus`` ranks split the model and its batch.

    The ranks form a mesh ``[pp, replicate, fsdp, tp]`` (torchtitan's order: tensor parallel
    innermost, within a node). ``fsdp`` shards parameters, gradients and optimizer state (FSDP2's
    ``fully_shard``, ZeRO-3; ``reshard_after_forward=False`` keeps the gathered parameters from the
    forward to the backward, ZeRO-2-like); ``replicate`` > 1 makes it HSDP (replicas of a sharded
    group). ``tp`` splits each block's matmuls (Colwise/Rowwise, sequence parallel on the norms, the
    loss on vocabulary-sharded logits); ``pp`` splits the layers into stages run by ``schedule``: one
    stage per pipeline rank, or ``stages_per_rank`` under a schedule that puts several on each
    (interleaved: ``pp x stages_per_rank`` stages, rank r holding stages r, r + pp, ...).
    ``cp`` splits each sequence across ranks (torch's context parallel: ring attention); FSDP then
    shards over ``fsdp x cp`` ranks, as torchtitan's does. ``ep`` splits a mixture-of-experts block's
    routed experts across ranks it borrows from ``fsdp x cp x tp`` (torchtitan's mesh at commit
    b5bcd76c66d0acb1a08b176d9639425bc55e0b2a, ``parallel_dims.py``: ep must divide
    ``dp_shard x cp x tp``; the experts are sharded by FSDP over the rest, ``efsdp``); there is no
    expert tensor parallel (torchtitan deprecated it). ``routing``: the assumption about the router's
    data-dependent dispatch (``even``, or ``skew:F``: the hottest expert receives F times its share).

    Batches: ``local_batch`` is what one data-parallel rank processes per optimizer step;
    ``microbatches`` splits it for the pipeline; ``accumulation`` runs that many forward/backward
    passes per step. ``global_batch``, if given, must be local x data-parallel degree x accumulation.

    ``ac``: ``none``; ``full`` (every block checkpointed); ``selective-layer`` (every ``ac_every``-th
    block, 2 by default; ``selective-layer:K`` sets K); ``selective-op`` (torch's selective
    checkpointing with torchtitan's op policy). ``mixed_precision="bf16"``: fp32 master weights and
    optimizer state, bf16 parameters for compute, gradients reduced in ``reduce_dtype``;
    ``"off"``: everything in ``model_dtype``.
    """

    # each field once: its default, and (opt) the help of `layerscope parallel`'s flag derived from it;
    # ``searched``: a dimension the search varies unless given (its flag defaults to None: not held)
    gpus: int = opt(least=1, help="ranks in the job")
    gpus_per_node: int = opt(8, least=1, help="ranks per node (default 8): tp stays within one")
    fsdp: int | None = opt(None, least=1, searched=True,   # None: the ranks left over by the other degrees
                           help="FSDP2 shard degree (default: the ranks the others leave)")
    replicate: int = opt(1, least=1, searched=True, help="HSDP: replicas of each shard group (default 1)")
    tp: int = opt(1, least=1, searched=True, help="tensor-parallel degree (default 1)")
    pp: int = opt(1, least=1, searched=True, help="pipeline stages: the uniform split of the blocks (default 1; the "
                                                  "cost-balanced split: `split`)")
    cp: int = opt(1, least=1, searched=True,
                  help="context-parallel degree: each sequence split across this many ranks, attention as torch's\n"
                       "ring (default 1)")
    ep: int = opt(1, least=1, searched=True,
                  help="expert-parallel degree: a MoE block's routed experts split across this many ranks, borrowed\n"
                       "from fsdp x cp x tp as torchtitan's mesh does (default 1)")
    routing: str = opt("even", metavar="ROUTING",
                       help="how the router spreads tokens over the experts (it depends on the data): even (default),\n"
                            "or skew:F, the hottest expert receiving F times its even share (F >= 1)")
    schedule: str = opt("1f1b", searched=True,
                        help="pipeline schedule, gpipe, 1f1b, interleaved, zb or zbv (default 1f1b; with --pp); zb "
                             "and zbv: zero bubble, each backward split in the input's gradient and the weights'")
    stages_per_rank: int = opt(2, least=2,      # under a schedule that puts several stages on each rank
                               help="stages on each pipeline rank under --schedule interleaved or zb (default 2): "
                                    "pp x this many stages; zbv puts exactly 2 on each rank, in a V")
    microbatches: int | None = opt(None, least=1, searched=True,   # None: pp (one per stage), 1 without a pipeline
                                   help="micro-batches per local batch (default: pp; with --pp)")
    accumulation: int = opt(1, least=1, searched=True, help="forward/backward passes per step (default 1)")
    local_batch: int | None = None
    global_batch: int | None = opt(None, least=1, searched=True,
                                   help="must be local batch x data-parallel degree x accumulation")
    ac: str = opt("none", searched=True, metavar="MODE",
                  help="activation checkpointing: none, full, selective-layer[:K], selective-op")
    ac_every: int = 2
    mixed_precision: Precision = opt("bf16", help="bf16 (default): fp32 master weights, bf16 compute; off: all in "
                                                  "--model-dtype")
    reduce_dtype: Any = opt("fp32", choices=("fp32", "bf16"), help="gradient reduction dtype")
    model_dtype: Any = opt("fp32", flag_name="--model-dtype")   # the flag every model command takes (cli/parser.py)
    reshard_after_forward: bool = opt(True, searched=True,
                                      help="keep gathered parameters from forward to backward (ZeRO-2-like)")
    offload: bool = opt(False, help="FSDP2's CPU offload: shards, reduced gradients and the optimizer step in host "
                                    "memory (reported apart from the device's peak); needs --fsdp or --replicate "
                                    "above 1")
    sequence_parallel: bool = True
    loss_parallel: bool = True

    def __post_init__(self) -> None:
        ints = {"gpus": self.gpus, "gpus_per_node": self.gpus_per_node, "replicate": self.replicate, "tp": self.tp,
                "pp": self.pp, "cp": self.cp, "ep": self.ep, "accumulation": self.accumulation,
                "ac_every": self.ac_every, "stages_per_rank": self.stages_per_rank}
        for k in ("fsdp", "microbatches", "local_batch", "global_batch"):
            if getattr(self, k) is not None:
                ints[k] = getattr(self, k)
        for k, v in ints.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise InputError(f"{k} must be a positive whole number, got {v!r}")
        object.__setattr__(self, "routing", _parse_routing(self.routing))
        ac = self.ac
        if isinstance(ac, str) and ac.startswith("selective-layer:"):
            every = ac.partition(":")[2]
            if not every.isdigit() or int(every) < 1:
                raise InputError(f"ac: selective-layer:K takes a positive K, got {ac!r}")
            object.__setattr__(self, "ac", "selective-layer")
            object.__setattr__(self, "ac_every", int(every))
        check_choice("ac", self.ac, AcMode)
        check_choice("mixed_precision", self.mixed_precision, Precision)
        object.__setattr__(self, "reduce_dtype", parse_dtype_name(self.reduce_dtype, "reduce_dtype"))
        object.__setattr__(self, "model_dtype", parse_dtype_name(self.model_dtype, "model_dtype"))
        kind = schedule_of(self.schedule)
        if self.pp > 1:
            kind.check_stages(self.stages, self.stages_per_rank, flag="pp x stages_per_rank",
                              of="stages_per_rank (--stages-per-rank)")
            if kind.zero_bubble and self.ac == "selective-op":
                # the zero-bubble schedules run two backwards through each region, I then W, and torch's
                # selective checkpointing refuses the second through a region whose saved ops the first used
                # ("Trying to backward an extra time"): with the op policy selective-op follows (torchtitan's),
                # both the simulation and torch's own run stop there (tried)
                raise InputError(f"the {kind.label} schedule runs each backward in two (the input's gradient, "
                                 "then the weights'), which torch refuses under selective-op checkpointing's "
                                 "op policy: use ac (--ac) full, selective-layer or none with it")
        rest, fixed = divmod(self.gpus, self.replicate * self.tp * self.pp * self.cp)
        zero_bubble_fsdp = self.pp > 1 and kind.zero_bubble and self.reshard_after_forward
        if self.fsdp is None:
            if fixed or rest < 1:
                raise InputError(f"gpus ({self.gpus}) must be a multiple of replicate x tp x pp x cp "
                                 f"({self.replicate} x {self.tp} x {self.pp} x {self.cp})")
            object.__setattr__(self, "fsdp", rest)
        if self.world != self.gpus:
            raise InputError(f"the degrees make {self.world} ranks (replicate {self.replicate} x fsdp {self.fsdp} x "
                             f"tp {self.tp} x pp {self.pp} x cp {self.cp}), not the {self.gpus} GPUs given")
        if (self.fsdp * self.cp * self.tp) % self.ep:
            # torchtitan's ParallelDims._validate: EP borrows its ranks from the sparse region dp_shard x cp x tp
            raise InputError(f"ep ({self.ep}) must divide fsdp x cp x tp ({self.fsdp} x {self.cp} x {self.tp} = "
                             f"{self.fsdp * self.cp * self.tp}): expert parallel borrows its ranks from them")
        if zero_bubble_fsdp and self.dp > 1:
            # run on torch 2.13 (FSDP 2 x PP 2, a 4-block Llama): torch's I ties the weights' gradients to the
            # parameters registered when it starts, the sharded ones (outside the graph) where FSDP resharded a
            # block after its forward, and that micro-batch's weight gradients are never computed: the last
            # stage's I found 2 of its 11 weights, the other stage's none in 2 of its 4; the run ended with no
            # gradient at all for the last block. torchtitan reshards nothing after the forward under PP
            raise InputError(f"the {kind.label} schedule with FSDP needs reshard_after_forward off "
                             "(--no-reshard-after-forward): torch's zero-bubble backward leaves the weights of a "
                             "block FSDP resharded after its forward without gradients")
        if self.offload and self.dp == 1:
            raise InputError("offload is FSDP2's CPU offload of the sharded parameters: it needs data parallelism "
                             f"(fsdp or replicate above 1), and {self.label()} has none")
        if self.tp > self.gpus_per_node:
            raise InputError(f"tp ({self.tp}) must fit in a node ({self.gpus_per_node} GPUs per node)")
        if self.microbatches is None:
            object.__setattr__(self, "microbatches", self.pp)
        if self.local_batch is not None and self.local_batch % self.microbatches:
            fit = [str(d) for d in range(1, self.local_batch + 1) if self.local_batch % d == 0]
            raise InputError(f"microbatches (--microbatches) {self.microbatches} does not divide the local batch "
                             f"{self.local_batch}: use {', '.join(fit[:-1]) + ' or ' if len(fit) > 1 else ''}{fit[-1]}")
        if self.global_batch is not None and self.local_batch is not None and \
                self.global_batch != self.local_batch * self.dp * self.accumulation:
            raise InputError(f"global batch {self.global_batch} != local batch {self.local_batch} x data-parallel "
                             f"degree {self.dp} x accumulation {self.accumulation} "
                             f"(= {self.local_batch * self.dp * self.accumulation})")

    @property
    def stages(self) -> int:
        """Pipeline stages: ``pp``, times ``stages_per_rank`` under a schedule that puts several on a rank."""
        return self.pp * schedule_of(self.schedule).per_rank(self.stages_per_rank)

    @property
    def dp(self) -> int:
        """The data-parallel degree: ranks that see different samples."""
        return self.replicate * self.fsdp

    @property
    def world(self) -> int:
        return self.pp * self.replicate * self.fsdp * self.tp * self.cp

    @property
    def trivial(self) -> bool:
        """Every degree 1: one device, no wrapping (memory() answers it)."""
        return self.world == 1

    @property
    def mesh_shape(self) -> tuple[tuple[str, int], ...]:
        """The mesh's named dimensions of size > 1, outermost first (torchtitan's order)."""
        dims = (("pp", self.pp), ("dp_replicate", self.replicate), ("dp_shard", self.fsdp), ("cp", self.cp),
                ("tp", self.tp))
        return tuple((n, s) for n, s in dims if s > 1)

    @property
    def efsdp(self) -> int:
        """FSDP's degree over the experts under expert parallel: the sparse region's ranks EP leaves
        (torchtitan's ``efsdp = dp_shard x cp x tp / ep``)."""
        return self.fsdp * self.cp * self.tp // self.ep

    @property
    def routing_skew(self) -> float:
        """The hottest expert's tokens over its even share: 1.0 under ``even``."""
        return 1.0 if self.routing == "even" else float(self.routing.partition(":")[2])

    @property
    def param_dtype(self) -> torch.dtype | None:
        """The dtype parameters are computed in (FSDP2's MixedPrecisionPolicy.param_dtype)."""
        return torch.bfloat16 if self.mixed_precision == "bf16" else None

    def label(self) -> str:
        pp = f"pp {self.pp}" + (f" ({self.schedule}, {self.stages // self.pp} stages per rank)"
                                 if self.pp > 1 and self.stages > self.pp else "")
        parts = [f"fsdp {self.fsdp}" + (f" x replicate {self.replicate}" if self.replicate > 1 else ""),
                 f"tp {self.tp}", pp] + [f"{k} {v}" for k, v in (("cp", self.cp), ("ep", self.ep)) if v > 1] \
            + ([f"routing {self.routing}"] if self.ep > 1 and self.routing != "even" else [])
        return ", ".join(parts) + f", ac {self.ac}" + (f":{self.ac_every}" if self.ac == "selective-layer" else "") \
            + (", CPU offload" if self.offload else "")
