"""Options of the entry points given as names or objects, resolved and checked once: optimizers,
autocast dtypes, and the forward's own keywords kept apart from the options."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

import torch

from .errors import InputError

__all__ = ["Mode", "Causal", "Schedule", "AnalyzeOptions", "MemoryOptions", "ProfileOptions", "OnnxOptions",
           "TileOptions", "PartitionOptions", "PipelineSchedule", "SCHEDULES", "schedule_of", "entry_options", "LAUNCHER_FIELDS",
           "forward_inputs", "optimizers", "optimizer_factory", "parse_autocast", "optimizer_name", "iec", "Loss",
           "LOSS_HELP", "check_loss",
           "parse_bytes", "parse_bandwidth", "ParallelConfig", "AcMode", "Precision", "parse_dtype_name", "DTYPES", "dtype_short"]

Mode = Literal["eval", "train", "same"]          # the model's flags for the run ("same": as they are)
Causal = Literal["dense", "unmasked"]            # causal attention as the kernel computes it, or its half
# the SDPA kernel priced for a GPU target: torch's CUDA rules ("auto") or one forced (capture/attention.py)
Attention = Literal["auto", "math", "flash", "efficient", "cudnn"]
Schedule = str                                   # a name in SCHEDULES (the one table of schedules, below)
# the loss of a simulated training step (capture/loss.py): one declaration for the Python keyword
# ``loss=`` of memory(), max_batch_size() and parallel(), and the CLI's --loss (its choices and help)
Loss = Literal["auto", "model", "cross-entropy", "sum"]
LOSS_HELP = {
    "auto": "the model's own loss where its forward takes labels and it has a language-model head (labels: a "
            "copy of the token ids), else the next-token cross-entropy where the output is language-model logits "
            "over the token ids, else the sum of the output",
    "model": "the model's own loss: its forward given labels (a copy of the token ids), as a training loop does",
    "cross-entropy": "the mean next-token cross-entropy of the logits in fp32 (labels: the ids shifted by one), "
                     "as transformers' causal-LM loss and torchtitan take it",
    "sum": "the sum of the output (its own .loss where labels are given): no language-model loss",
}


def _choice(name: str, value: Any, allowed) -> None:
    options = get_args(allowed)
    if value not in options:
        quoted = [repr(o) for o in options]
        raise InputError(f"{name} must be {', '.join(quoted[:-1])} or {quoted[-1]}, got {value!r}")


@dataclass(frozen=True, slots=True)
class AnalyzeOptions:
    """Every option of ``analyze()`` (``activations()`` takes its ``mode``; ``analyze_exported()`` and
    ``analyze_torchscript()`` those that apply to a graph): checked when made."""

    input_size: Any = None           # builds example inputs, as torchinfo's input_size does
    dtypes: Any = None
    batch_dim: int | None = None
    device: Any = None               # where the analysis runs ("meta": nothing computed)
    mode: Mode = "eval"
    backward: bool = False
    causal: Causal = "dense"
    costs: Any = None                # a layerscope.costs.CostRegistry (checked by the API, a layer up)
    gpu: Any = None                  # the GPU a meta run prices SDPA for: a name of the table or a GPU row
    attention: Attention = "auto"    # the SDPA kernel priced: torch's CUDA rules for ``gpu``, or one forced

    def __post_init__(self) -> None:
        _choice("mode", self.mode, Mode)
        _choice("causal", self.causal, Causal)
        _choice("attention", self.attention, Attention)


@dataclass(frozen=True, slots=True)
class MemoryOptions:
    """Every option of ``memory()`` (and of the steps ``max_batch_size()`` simulates): checked, the
    optimizer and autocast dtype resolved."""

    optimizer: Any = None            # a callable params -> Optimizer (from a class, name or instance)
    training: bool = True
    autocast_dtype: torch.dtype | None = None
    device: Any = None               # where the memory is predicted for (default: where the model is)
    batch_dim: int | None = None
    input_size: Any = None
    dtypes: Any = None
    batch_size: int | None = None
    loss_fn: Any = None              # a callable output -> scalar loss: overrides ``loss``
    loss: Loss = "auto"              # the step's loss when there is no loss_fn (LOSS_HELP, capture/loss.py)
    steps: int = 2
    accumulation: int = 1
    simulate: bool = True
    measure: bool | None = None
    limit: Any = None                # bytes or "80GiB", shown against the peak
    progress: bool = False
    gpu: Any = None                  # the GPU predicted for (implies device "cuda"): a table name or a GPU row
    attention: Attention = "auto"    # the SDPA kernel simulated: torch's CUDA rules for ``gpu``, or one forced
    keep_output: bool = True         # the model's output alive through the backward (False: let go once the
                                     # loss is computed, as torchtitan's ``del pred``)
    compose: bool = True             # a run of identical blocks: simulate four, compose the rest (the same
                                     # report; capture/compose.py); False simulates every block

    def __post_init__(self) -> None:
        _choice("attention", self.attention, Attention)
        _choice("loss", self.loss, Loss)
        if self.loss_fn is not None and self.loss != "auto":
            raise InputError(f"give loss_fn= or loss= ({self.loss!r}), not both: a loss_fn is the loss")
        if self.steps < 1 or self.accumulation < 1:
            raise InputError("steps and accumulation must be at least 1")
        if self.optimizer is not None and not self.training:
            raise InputError("an optimizer only applies to a training step (training=True)")
        if self.batch_size is not None and self.batch_size < 1:
            raise InputError(f"batch_size must be at least 1, got {self.batch_size}")
        object.__setattr__(self, "optimizer", optimizer_factory(self.optimizer))
        object.__setattr__(self, "autocast_dtype", parse_autocast(self.autocast_dtype))


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """Every option of ``profile()``: the timed runs and what they run on."""

    warmup: int | str = "auto"
    repeats: int | str = "auto"
    backward: bool = False
    device: Any = None               # where example inputs built from input_size go
    input_size: Any = None
    dtypes: Any = None
    loss_fn: Any = None
    roofline: Any = None
    progress: bool = False

    def __post_init__(self) -> None:
        def ok(v, least: int) -> bool:
            return v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= least)
        if not ok(self.warmup, 0) or not ok(self.repeats, 1):
            raise InputError(f"warmup must be >= 0 and repeats >= 1 (or \"auto\"), got {self.warmup!r} and "
                             f"{self.repeats!r}")


@dataclass(frozen=True, slots=True)
class OnnxOptions:
    """Every option of ``analyze_onnx()``."""

    input_shapes: dict | None = None  # {input name: shape} and/or {symbolic dim: value}
    costs: Any = None                 # a layerscope.costs.CostRegistry (checked by the API, a layer up)


@dataclass(frozen=True, slots=True)
class TileOptions:
    """Every option of ``onnx_tile()``."""

    block: tuple = (64, 64, 64)       # (M, K, N) of each block
    ops: tuple = ("Gemm", "MatMul")
    nodes: Any = None
    input_shapes: dict | None = None
    verify: bool = False


def check_loss(value) -> str:
    """``value`` if it is one of ``Loss``'s choices; one clear InputError otherwise."""
    _choice("loss", value, Loss)
    return value


def _at_default(value: Any, default: Any) -> bool:
    return value is default or (type(value) is type(default) and value == default)


def entry_options(cls, options, kwargs: dict, forward_kwargs: dict | None = None, *, take: bool = True,
                  base=None, keep: tuple[str, ...] = (), **named: Any):
    """``(options object, the forward's keyword inputs)`` of one call of an entry point, built once.
    Every entry point (analyze, memory, profile, partition, the launcher, ...) builds its options here.

    ``named``: the options the signature names. With ``take``, every other option of ``cls`` (but
    those in ``keep``, which stay the forward's: the launcher's ``input_ids`` for ``partition()``) is
    still accepted as a keyword, taken out of ``kwargs``; the rest of ``kwargs``, with
    ``forward_kwargs``, goes to the forward. ``base``: the object the keywords change when there is
    no ``options=`` (default ``cls()``). An option counts as given when it is not None and, for a
    named one, not at the base's value. With ``options=`` given (an instance of ``cls``), an option
    also given as a keyword is an InputError: each option has one source."""
    start = cls() if base is None else base
    names = {f.name for f in fields(cls)} - set(keep)
    taken = {k: v for k, v in kwargs.items() if take and k in names}
    forward = forward_inputs({k: v for k, v in kwargs.items() if k not in taken}, forward_kwargs)
    given = {k: v for k, v in named.items() if v is not None and not _at_default(v, getattr(start, k))}
    given.update((k, v) for k, v in taken.items() if v is not None)
    if options is None:
        return (dataclasses.replace(start, **given) if given else start), forward
    if not isinstance(options, cls):
        raise InputError(f"options must be a layerscope.{cls.__name__}, got {type(options).__name__}")
    if given:
        raise InputError(f"{', '.join(sorted(given))} given both as a keyword and in options=")
    return options, forward


def forward_inputs(kwargs: dict, forward_kwargs: dict | None) -> dict:
    """The keyword arguments for the model's forward: those no option of the entry point took, and
    ``forward_kwargs`` (for a forward argument named like an option: ``mode``, ``device``, ``steps``)."""
    if forward_kwargs is None:
        return kwargs
    if not isinstance(forward_kwargs, dict) or not all(isinstance(k, str) for k in forward_kwargs):
        raise InputError(f"forward_kwargs must be a dict of argument names, got {type(forward_kwargs).__name__}")
    both = sorted(set(kwargs) & set(forward_kwargs))
    if both:
        raise InputError(f"{', '.join(both)} given both as a keyword and in forward_kwargs")
    return {**kwargs, **forward_kwargs}


# the floating-point dtypes options name, by every name they take (model, reduction and autocast dtypes)
DTYPES = {"fp32": torch.float32, "float32": torch.float32, "float": torch.float32, "bf16": torch.bfloat16,
          "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16, "half": torch.float16}
_SHORT = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
_AUTOCAST = {k: v for k, v in DTYPES.items() if v is not torch.float32}


def dtype_short(dtype: torch.dtype) -> str:
    """``fp32``, ``bf16`` or ``fp16`` (another dtype: its torch name)."""
    return _SHORT.get(dtype, str(dtype).replace("torch.", ""))


def optimizers() -> dict[str, type]:
    return {name.lower(): cls for name, cls in vars(torch.optim).items()
            if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
            and cls is not torch.optim.Optimizer}


def optimizer_factory(optimizer):
    """A callable params -> Optimizer from a class, a factory, an instance (its class and defaults)
    or a name such as "adamw"."""
    if optimizer is None or callable(optimizer) and not isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if isinstance(optimizer, torch.optim.Optimizer):
        cls, defaults = type(optimizer), dict(optimizer.defaults)
        return lambda params: cls(params, **defaults)
    if isinstance(optimizer, str):
        table = optimizers()
        cls = table.get(optimizer.lower().replace("-", "").replace("_", ""))
        if cls is None:
            raise InputError(f"unknown optimizer {optimizer!r}; torch.optim has {', '.join(sorted(table))}")
        return cls
    raise InputError(f"optimizer must be a torch.optim class, a factory taking the parameters, an "
                     f"optimizer instance or a name, got {type(optimizer).__name__}")


def parse_autocast(value) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    if isinstance(value, str) and value.lower() in _AUTOCAST:
        return _AUTOCAST[value.lower()]
    raise InputError(f"autocast_dtype must be torch.bfloat16, torch.float16 or one of "
                     f"{', '.join(_AUTOCAST)}, got {value!r}")


def optimizer_name(factory) -> str | None:
    if factory is None:
        return None
    if isinstance(factory, type):
        return factory.__name__
    func = getattr(factory, "func", None)  # functools.partial
    if isinstance(func, type):
        kw = ", ".join(f"{k}={v!r}" for k, v in factory.keywords.items())
        return f"{func.__name__}({kw})"
    return getattr(factory, "__name__", type(factory).__name__)


# --- byte sizes and bandwidths: parsed here, at the boundary, for every layer above -------------

_IEC = (("EiB", 2 ** 60), ("PiB", 2 ** 50), ("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10))
_BYTE_UNITS = {"": 1, "b": 1, "k": 10 ** 3, "kb": 10 ** 3, "m": 10 ** 6, "mb": 10 ** 6, "g": 10 ** 9,
               "gb": 10 ** 9, "t": 10 ** 12, "tb": 10 ** 12, "kib": 2 ** 10, "mib": 2 ** 20,
               "gib": 2 ** 30, "tib": 2 ** 40}


def iec(n: float | int | None, digits: int = 2) -> str:
    """Bytes in IEC units (``1.50 GiB``). It lives beside ``parse_bytes`` so that an error message
    below render/ (a memory limit no split fits) states sizes as render/ does: render/units.py
    re-exports it, so bytes are formatted in one place."""
    if n is None:
        return "--"
    n = float(n)
    for unit, scale in _IEC:
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{int(n)} B"


def parse_bytes(value) -> int:
    """Bytes from an int or a string such as "80GiB", "80 GB", "512MiB" (GB = 10^9, GiB = 2^30)."""
    if isinstance(value, bool):
        raise InputError(f"expected a memory size such as 80GiB, got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise InputError(f"a memory size must be positive, got {value!r}")
        return int(value)
    text = str(value).strip().lower().replace(" ", "")
    num = text.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = text[len(num):]
    try:
        n = float(num)
    except ValueError:
        n = None
    if unit not in _BYTE_UNITS or n is None or n != n:
        raise InputError(f"expected a memory size such as 80GiB, 40GB or 512MiB, got {value!r}")
    if n <= 0:
        # "0GiB" and "-5GiB" are well-formed sizes: say what is wrong with them, not that they are not sizes
        raise InputError(f"a memory size must be positive, got {value!r}")
    return int(n * _BYTE_UNITS[unit])


def parse_bandwidth(text: str) -> float:
    """'50e9', '50GB/s', '2.5TB/s' -> bytes per second (ValueError with the reason otherwise: the
    CLI turns it into its own usage error)."""
    t = text.strip()
    scale = 1.0
    for suffix, mult in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("B/s", 1.0)):
        if t.upper().endswith(suffix.upper()):
            t, scale = t[:-len(suffix)].strip(), mult
            break
    try:
        v = float(t) * scale
    except ValueError:
        raise ValueError(f"{text!r} is not a bandwidth (e.g. 50e9 or 50GB/s)") from None
    if v <= 0:
        raise ValueError(f"{text!r}: a bandwidth must be positive")
    return v


# --- pipeline schedules: one table; code branches on these fields, never on a schedule's name ----

@dataclass(frozen=True, slots=True)
class PipelineSchedule:
    """One of torch.distributed.pipelining's schedules as the planner, the simulation and the runs
    see it. Adding a schedule is one entry of ``SCHEDULES`` (and, for a runtime schedule, its order
    builder in ``_compat.schedule_order``)."""

    name: str
    torch_class: str              # in torch.distributed.pipelining
    order: Literal["gpipe", "1f1b", "runtime"]   # how a rank orders its actions: all forwards then
    #                               all backwards, warm-up then one backward one forward, or torch's
    #                               own per-rank order (a runtime schedule, several stages per rank)
    zero_bubble: bool = False     # each backward split into I (the input's gradient) and W (weights')
    v_shape: bool = False         # stages placed in a V (rank r owns r and 2P - 1 - r), else in a loop
    fixed_per_rank: int | None = None   # stages per rank the schedule fixes (zbv: 2)
    min_per_rank: int = 1         # the fewest stages per rank it takes (interleaved: 2)
    rounds: bool = False          # torch runs the micro-batches in rounds of the ranks' count
    export_stages: bool = True    # torch.export stages connect under it (zbv's V: not, torch 2.13)
    label: str = ""               # how error messages name it

    @property
    def multi(self) -> bool:
        """Several stages on each rank (torch's runtime schedules)."""
        return self.order == "runtime"

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

    def torch_schedule(self):
        import torch.distributed.pipelining as pp
        return getattr(pp, self.torch_class)


SCHEDULES: dict[str, PipelineSchedule] = {s.name: s for s in (
    PipelineSchedule("gpipe", "ScheduleGPipe", "gpipe"),
    PipelineSchedule("1f1b", "Schedule1F1B", "1f1b"),
    PipelineSchedule("interleaved", "ScheduleInterleaved1F1B", "runtime", min_per_rank=2, rounds=True,
                     label="interleaved 1F1B"),
    PipelineSchedule("zb", "ScheduleInterleavedZeroBubble", "runtime", zero_bubble=True, rounds=True,
                     label="interleaved zero bubble"),
    PipelineSchedule("zbv", "ScheduleZBVZeroBubble", "runtime", zero_bubble=True, v_shape=True,
                     fixed_per_rank=2, export_stages=False, label="ZBV zero bubble"),
)}


def schedule_of(name) -> PipelineSchedule:
    """The schedule named ``name`` (or ``name`` itself, a PipelineSchedule); one clear error otherwise."""
    if isinstance(name, PipelineSchedule):
        return name
    found = SCHEDULES.get(name) if isinstance(name, str) else None
    if found is None:
        raise InputError(f"schedule must be one of {', '.join(SCHEDULES)}, got {name!r}")
    return found


# --- partition, split --run and the torchrun launcher: one options object -----------------------

@dataclass(frozen=True, slots=True)
class PartitionOptions:
    """Every option of ``partition()``, ``layerscope split`` and ``torchrun.launch()``: the entry
    points take the few most calls use as keywords and the rest here (or as keywords, pulled in by
    ``entry_options``); everything below them takes this object. The launcher's own fields (from
    ``overrides`` on) say how every rank builds the model from its spec and trains it."""

    stages: int | None = None
    by: Any = "flops"                    # a cost name or a callable Unit -> cost
    memory_limit: Any = None             # bytes, "16GiB", or one per stage
    schedule: str = "1f1b"
    microbatches: int = 1
    optimizer: Any = None
    stages_per_rank: int = 2
    batch_dim: int = 0
    input_size: Any = None
    dtypes: Any = None
    autocast_dtype: Any = None
    device: Any = None
    latency_repeats: int = 5
    loss_fn: Any = None
    measure_working: bool | None = None
    objective: str | None = None
    roofline: Any = None
    link_bandwidth: float | None = None
    optimizer_bandwidth: float | None = None
    cuts: Any = None
    return_outputs: bool = True
    count_inputs: bool | None = None
    target_bytes: int = 0
    # the launcher (torchrun): the model from its spec, the run
    overrides: dict | None = None
    head: str | None = None
    input_ids: Any = None
    model_dtype: str | None = None
    allow_pickle: bool = False
    batch_size: int = 8
    steps: int = 3
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

AcMode = Literal["none", "full", "selective-layer", "selective-op"]
Precision = Literal["bf16", "off"]

def parse_dtype_name(value, what: str) -> torch.dtype:
    """A dtype from ``fp32``/``bf16``/``fp16`` (or their long names, or a torch.dtype)."""
    if isinstance(value, torch.dtype):
        return value
    found = DTYPES.get(str(value).lower().replace("torch.", ""))
    if found is None:
        raise InputError(f"{what} must be fp32, bf16 or fp16, got {value!r}")
    return found


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
    ``cp`` (context) and ``ep`` (expert) parallel are reserved for what comes next and must be 1.

    Batches: ``local_batch`` is what one data-parallel rank processes per optimizer step;
    ``microbatches`` splits it for the pipeline; ``accumulation`` runs that many forward/backward
    passes per step. ``global_batch``, if given, must be local x data-parallel degree x accumulation.

    ``ac``: ``none``; ``full`` (every block checkpointed); ``selective-layer`` (every ``ac_every``-th
    block, 2 by default; ``selective-layer:K`` sets K); ``selective-op`` (torch's selective
    checkpointing with torchtitan's op policy). ``mixed_precision="bf16"``: fp32 master weights and
    optimizer state, bf16 parameters for compute, gradients reduced in ``reduce_dtype``;
    ``"off"``: everything in ``model_dtype``.
    """

    gpus: int
    gpus_per_node: int = 8
    fsdp: int | None = None              # None: the ranks left over by the other degrees
    replicate: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    schedule: str = "1f1b"
    stages_per_rank: int = 2             # under a schedule that puts several stages on each rank
    microbatches: int | None = None      # None: pp (one per stage), 1 without a pipeline
    accumulation: int = 1
    local_batch: int | None = None
    global_batch: int | None = None
    ac: str = "none"
    ac_every: int = 2
    mixed_precision: Precision = "bf16"
    reduce_dtype: Any = "fp32"
    model_dtype: Any = "fp32"
    reshard_after_forward: bool = True
    offload: bool = False
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
        if self.cp != 1 or self.ep != 1:
            raise InputError("context and expert parallel (cp, ep) are not simulated yet: leave them at 1")
        ac = self.ac
        if isinstance(ac, str) and ac.startswith("selective-layer:"):
            every = ac.partition(":")[2]
            if not every.isdigit() or int(every) < 1:
                raise InputError(f"ac: selective-layer:K takes a positive K, got {ac!r}")
            object.__setattr__(self, "ac", "selective-layer")
            object.__setattr__(self, "ac_every", int(every))
        _choice("ac", self.ac, AcMode)
        _choice("mixed_precision", self.mixed_precision, Precision)
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
                raise InputError(f"gpus ({self.gpus}) must be a multiple of replicate x tp x pp "
                                 f"({self.replicate} x {self.tp} x {self.pp})")
            object.__setattr__(self, "fsdp", rest)
        if self.world != self.gpus:
            raise InputError(f"the degrees make {self.world} ranks (replicate {self.replicate} x fsdp {self.fsdp} x "
                             f"tp {self.tp} x pp {self.pp}), not the {self.gpus} GPUs given")
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
        dims = (("pp", self.pp), ("dp_replicate", self.replicate), ("dp_shard", self.fsdp), ("tp", self.tp))
        return tuple((n, s) for n, s in dims if s > 1)

    @property
    def param_dtype(self) -> torch.dtype | None:
        """The dtype parameters are computed in (FSDP2's MixedPrecisionPolicy.param_dtype)."""
        return torch.bfloat16 if self.mixed_precision == "bf16" else None

    def label(self) -> str:
        pp = f"pp {self.pp}" + (f" ({self.schedule}, {self.stages // self.pp} stages per rank)"
                                 if self.pp > 1 and self.stages > self.pp else "")
        parts = [f"fsdp {self.fsdp}" + (f" x replicate {self.replicate}" if self.replicate > 1 else ""),
                 f"tp {self.tp}", pp]
        return ", ".join(parts) + f", ac {self.ac}" + (f":{self.ac_every}" if self.ac == "selective-layer" else "") \
            + (", CPU offload" if self.offload else "")
