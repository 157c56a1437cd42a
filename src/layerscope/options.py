"""Options of the entry points given as names or objects, resolved and checked once: optimizers,
autocast dtypes, and the forward's own keywords kept apart from the options.

Each option is declared once, as a field of its entry point's options class: its type, its default,
and, through ``opt(...)``, its help, its command-line flag and what the report echoes. The Python
keywords (``entry_options``), the CLI's flags (cli/flags.py) and the JSON echo of the options
(``echo``) are derived from those declarations: adding an option is adding one field."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, fields
from typing import Any, Literal, get_args

import torch

from .errors import InputError

__all__ = ["Mode", "Causal", "Schedule", "AnalyzeOptions", "MemoryOptions", "ProfileOptions", "OnnxOptions",
           "TileOptions", "ParallelOptions", "entry_options", "check_choice", "opt", "flag_fields", "echo",
           "forward_inputs", "optimizers", "optimizer_factory", "parse_autocast", "optimizer_name", "Loss",
           "LOSS_HELP", "check_loss",
           "iec", "parse_bytes", "parse_bandwidth", "parse_dtype_name", "DTYPES", "dtype_short"]

Mode = Literal["eval", "train", "same"]          # the model's flags for the run ("same": as they are)
Causal = Literal["dense", "unmasked"]            # causal attention as the kernel computes it, or its half
# the SDPA kernel priced for a GPU target: torch's CUDA rules ("auto") or one forced (capture/attention.py)
Attention = Literal["auto", "math", "flash", "efficient", "cudnn"]
Schedule = str                                   # a name in planning.config.SCHEDULES (the one table of schedules)
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


_LOSS_FLAG_HELP = "the training step's loss (default auto):\n" + "\n".join(
    f"  {k}: {LOSS_HELP[k]}" for k in get_args(Loss))


# the flags --gpu and --attention of summary, memory and report (AnalyzeOptions', MemoryOptions')
_GPU_HELP = ("the GPU to price attention for (a meta run; memory: predicts for CUDA):\n{gpus}; any figure replaced, "
             "e.g.\nH100,capability=8.0 (also memory, bandwidth, a dtype's peak)")
_ATTENTION_HELP = ("the SDPA kernel priced: auto (default) picks as torch's CUDA rules do for\n--gpu (without one: "
                   "H200 where a CUDA target is simulated), or force one")


# --- one declaration per option: its field, with the flag, help and echo it carries -------------

def opt(default: Any = dataclasses.MISSING, *, help: str | None = None, flag_name: str | bool | None = None,
        choices: tuple | None = None, least: int | None = None, arg: str | None = None,
        cli_default: Any = dataclasses.MISSING, searched: bool = False, echo: Any = False, **flag: Any) -> Any:
    """One option's field: ``default`` and what the CLI and the report derive from it.

    ``help``: the flag's help (no help and no ``flag_name``: no flag, a keyword only). ``flag_name``:
    the flag's name (default ``--`` and the field's name with dashes; False: none). ``choices``: the
    values the flag takes (default: a Literal type's). ``least``: the smallest whole number the flag
    takes. ``arg``: a converter of the CLI's argtypes by name (gpu, bandwidth, device, ints, float).
    ``cli_default``: the flag's default where it is not the field's (None: "not given", the field's
    default then applies: where another flag changes the default). ``searched``: a dimension the
    search varies unless given (its flag defaults to None). ``echo``: the report echoes it (True: as
    it is; a callable: what the report shows of it). ``flag``: ``metavar``; ``action`` (argparse's
    ``append``, or ``optional``: both ``--NAME`` and ``--no-NAME``; a bool field is otherwise a switch,
    ``--no-NAME`` where it defaults to True); ``required`` (the command cannot run without the flag,
    while the keyword may still default); ``hidden`` (still taken, not shown: a replaced flag)."""
    unknown = set(flag) - {"metavar", "action", "required", "hidden"}
    if unknown:
        raise TypeError(f"opt() takes no {', '.join(sorted(unknown))}")
    meta = {"help": help, "flag": flag_name, "choices": choices, "least": least, "arg": arg, "searched": searched,
            "echo": echo, **flag}
    meta = {k: v for k, v in meta.items() if v is not None and v is not False}
    if cli_default is not dataclasses.MISSING or searched:
        meta["cli_default"] = None if searched else cli_default
    return dataclasses.field(default=default, metadata=meta)


def flag_fields(cls) -> list:
    """The fields of the options class ``cls`` that are command-line flags, in declaration order."""
    return [f for f in fields(cls) if f.metadata.get("flag", True) is not False
            and ("help" in f.metadata or "flag" in f.metadata or "hidden" in f.metadata)]


def echo(options, **resolved: Any) -> dict:
    """What a report echoes of ``options``: its fields declared with ``echo``, in declaration order,
    each as ``resolved`` gives it (the value the run used: a resolved device, a backend chosen by
    default) or as the object holds it, through the field's own echo function where it has one."""
    out = {}
    for f in fields(options):
        how = f.metadata.get("echo")
        if how:
            value = resolved.get(f.name, getattr(options, f.name))
            out[f.name] = how(value) if callable(how) and value is not None else value
    return out


def check_choice(name: str, value: Any, allowed) -> None:
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
    # each field once; those with a help (or a flag_name) are `layerscope summary`'s flags
    device: Any = opt(None, arg="device",   # where the analysis runs ("meta": nothing computed)
                      help="cpu, cuda, or meta (count without computing)")
    mode: Mode = opt("eval", flag_name="--mode")
    backward: bool = opt(False, help="also run and count a backward pass")
    causal: Causal = opt("dense", help="count causal attention densely (default) or only its unmasked part")
    costs: Any = None                # a layerscope.costs.CostRegistry (checked by the API, a layer up)
    gpu: Any = opt(None, arg="gpu", metavar="NAME[,FIELD=V]", help=_GPU_HELP)   # a name of the table or a GPU row
    attention: Attention = opt("auto", help=_ATTENTION_HELP)   # torch's CUDA rules for ``gpu``, or one forced

    def __post_init__(self) -> None:
        check_choice("mode", self.mode, Mode)
        check_choice("causal", self.causal, Causal)
        check_choice("attention", self.attention, Attention)


@dataclass(frozen=True, slots=True)
class MemoryOptions:
    """Every option of ``memory()`` (and of the steps ``max_batch_size()`` simulates): checked, the
    optimizer and autocast dtype resolved."""

    # each field once; those with a help are the flags of `layerscope memory` (and `report`: cli/parser.py)
    optimizer: Any = opt(None,       # a callable params -> Optimizer (from a class, name or instance)
                         help="a torch.optim class name: adamw, adam, sgd, adagrad, rmsprop, ...")
    training: bool = True
    autocast_dtype: torch.dtype | None = opt(None, flag_name="--autocast", choices=("bf16", "fp16"),
                                             help="run forward and loss under torch.autocast")
    device: Any = opt(None, arg="device",   # where the memory is predicted for (default: where the model is)
                      help="the device to predict for: cpu or cuda (512-byte allocator blocks); default where the "
                           "model is (hf: specs are built on meta)")
    batch_dim: int | None = None
    input_size: Any = None
    dtypes: Any = None
    batch_size: int | None = opt(None, least=1, help="re-size the inputs' batch dimension to N")
    loss_fn: Any = None              # a callable output -> scalar loss: overrides ``loss``
    loss: Loss = opt("auto", help=_LOSS_FLAG_HELP)   # the step's loss when there is no loss_fn (capture/loss.py)
    steps: int = opt(2, least=1, help="training steps to run (default 2)")
    accumulation: int = opt(1, least=1, help="micro-batches per step (default 1)")
    simulate: bool = True
    measure: bool | None = opt(None, action="store_true", cli_default=False,
                               help="also run the real step and measure it")
    limit: Any = opt(None,           # bytes or "80GiB", shown against the peak
                     help="memory limit such as 80GiB: says whether the peak fits, and the largest batch that does")
    progress: bool = False
    gpu: Any = opt(None, arg="gpu", metavar="NAME[,FIELD=V]", help=_GPU_HELP)   # implies device "cuda"
    attention: Attention = opt("auto", help=_ATTENTION_HELP)   # torch's CUDA rules for ``gpu``, or one forced
    keep_output: bool = True         # the model's output alive through the backward (False: let go once the
                                     # loss is computed, as torchtitan's ``del pred``)
    compose: bool = True             # a run of identical blocks: simulate four, compose the rest (the same
                                     # report; capture/compose.py); False simulates every block

    def __post_init__(self) -> None:
        check_choice("attention", self.attention, Attention)
        check_choice("loss", self.loss, Loss)
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


SEARCH_LIMIT = 40      # parallel(search=True)'s default work limit, in simulation passes


def _gpu_name(gpu) -> str:
    return getattr(gpu, "name", gpu)


@dataclass(frozen=True, slots=True)
class ParallelOptions:
    """Every option of ``parallel()`` but the model's configuration's degrees (``config``: a
    planning.config.ParallelConfig; with ``search=True``, a dict of the configuration's fields held
    fixed, ``gpus`` among them). The fields up to ``steps`` are those the report echoes, in its
    order; the CLI's ``layerscope parallel`` takes its flags from these declarations."""

    device: str = opt("cuda", choices=("cuda", "cpu"), echo=True,
                      help="the ranks' device: cuda (default) or cpu (gloo ranks)")
    backend: str | None = opt(None, echo=True)     # nccl for cuda, gloo for cpu; "fake": no backend buffers
    gpu: Any = opt(None, arg="gpu", metavar="NAME[,FIELD=V]", echo=_gpu_name,
                   help="the ranks' GPU ({gpus}): its memory is the limit")
    optimizer: Any = opt("adamw", echo=lambda f: optimizer_name(optimizer_factory(f)),
                         help="a torch.optim class name (default adamw)")
    steps: int = opt(2, least=1, cli_default=None, echo=True,   # --run's default is 4: the flag's is None
                     help="training steps simulated (default 2) and, with --run, run (default 4, at least 3:\n"
                          "the first two are not measured)")
    memory_limit: Any = opt(None, help="per-rank limit such as 80GiB (default: --gpu's memory)")
    loss: Loss = opt("auto", help=_LOSS_FLAG_HELP)
    loss_fn: Any = None               # loss_fn(output) (or loss_fn(output, target)): instead of ``loss``
    target: Any = None                # a tensor of the local batch for loss_fn(output, target)
    input_size: Any = None
    dtypes: Any = None
    progress: bool = False
    search: bool = opt(False, help="search the fastest configuration that fits --gpu: FSDP/HSDP x tp x pp x --ac x\n"
                                   "resharding x micro-batches for --global-batch (default: the input's batch x "
                                   "--gpus);\nthe degrees and options given are held fixed")
    search_limit: int | None = opt(
        SEARCH_LIMIT, least=1, metavar="PASSES", cli_default=None,
        help="with --search: simulate no new candidate past this much work (default 40), in passes\n"
             "of a micro-batch through a stage (a candidate without a pipeline takes 1, 2 with\n"
             "accumulation; a pipeline, stages x micro-batches; a copy made for the lower bounds,\n"
             "1): the answer does not depend on the machine's speed")
    jobs: int | None = opt(
        None, least=1, metavar="N",
        help="with --search: simulate candidates in N worker processes at once (default: the cores\n"
             "this process may use; 1: none); the answer is the same whatever N")
    time_budget: Any = opt(None, arg="float", hidden=True)      # replaced by search_limit: refused with why
    fractions: dict | None = opt(None, flag_name="--fraction", action="append", metavar="NAME=V",
                                 help="step-time model: replace an achievable fraction (matmul, attention, memory, "
                                      "link)\nor a time (launch_s, nvlink_latency_s, network_latency_s, host_op_s, "
                                      "host_tp_op_s,\nhost_sac_op_s); repeatable")
    config: Any = None

    def __post_init__(self) -> None:
        if self.time_budget is not None:
            # the search's wall-clock budget is gone: its answer depended on the machine's speed
            raise InputError("time_budget= was replaced by search_limit= (a count of simulation passes, not seconds, "
                             "so the search's answer does not depend on the machine's speed; default "
                             f"{SEARCH_LIMIT})")
        n = self.search_limit
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise InputError(f"search_limit is a count of simulation passes, at least 1 (or None: no limit), "
                             f"got {n!r}")
        n = self.jobs
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise InputError(f"jobs is a count of worker processes, at least 1 (or None: the cores this process "
                             f"may use), got {n!r}")
        check_choice("loss", self.loss, Loss)
        if self.loss_fn is not None and self.loss != "auto":
            raise InputError(f"give loss_fn= or loss= ({self.loss!r}), not both: a loss_fn is the loss")
        optimizer_factory(self.optimizer)          # a bad one refused here; kept as given (parallel() resolves it)


@dataclass(frozen=True, slots=True)
class ProfileOptions:
    """Every option of ``profile()``: the timed runs and what they run on."""

    # each field once; those with a help are `layerscope profile`'s flags
    warmup: int | str = opt("auto", arg="count_or_auto", least=0,
                            help="untimed warm-up runs, or auto (the default): 1 to 3, more while runs get faster")
    repeats: int | str = opt("auto", arg="count_or_auto", least=1,
                             help="timed repeats, or auto (the default): 6 to 20, stopping when every median that\n"
                                  "matters is known within +-2%% (whole run) / +-5%% (calls over 5%% of it), 95%% "
                                  "confidence")
    backward: bool = opt(False, help="also time the backward pass")
    device: Any = opt(None, arg="device",   # where example inputs built from input_size go; the CLI builds there
                      help="where to build the model and run it: cpu (default) or cuda")
    input_size: Any = None
    dtypes: Any = None
    loss_fn: Any = None
    roofline: Any = opt(None, metavar="PEAKS",
                        help="class each layer compute- or memory-bound and show its distance from the roof:\n"
                             "a GPU from the built-in table (V100, A100, A100-40GB, L4, H100, H100-PCIE, H200),\n"
                             "'measure' (a short matmul and copy microbenchmark here), 'auto' (the table\n"
                             "for a known GPU, else measured) or 'FLOPS,BYTES_PER_S' such as 989e12,3.35e12")
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

    # {input name: shape} and/or {symbolic dim: value}; the CLI's NAME=DIMS items are parsed by cli/onnx.py
    input_shapes: dict | None = opt(None, flag_name="--input", action="append", metavar="NAME=DIMS",
                                    help="an input's shape (input_ids=1,128) or a symbolic dim's value (batch=8); "
                                         "repeatable")
    costs: Any = None                 # a layerscope.costs.CostRegistry (checked by the API, a layer up)


@dataclass(frozen=True, slots=True)
class TileOptions:
    """Every option of ``onnx_tile()``."""

    block: tuple = opt((64, 64, 64), arg="ints", metavar="M,K,N",      # (M, K, N) of each block
                       help="block sizes (default 64,64,64)")
    # the CLI takes a comma-separated string (cli/onnx.py splits it)
    ops: tuple = opt(("Gemm", "MatMul"), cli_default="Gemm,MatMul", help="node types to tile (default Gemm,MatMul)")
    nodes: Any = opt(None, help="only these nodes (comma-separated names)")
    input_shapes: dict | None = opt(None, flag_name="--input", action="append", metavar="NAME=DIMS",
                                    help="as for `layerscope onnx`")
    verify: bool = opt(False, help="run both models in onnxruntime on random inputs and report the max abs error "
                                   "and MSE")


def check_loss(value) -> str:
    """``value`` if it is one of ``Loss``'s choices; one clear InputError otherwise."""
    check_choice("loss", value, Loss)
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
# (parsing an option's value is validating it, so it lives with the options; ``iec`` writes sizes back in
# the same units: the one formatter of bytes, kept beside its inverse in the base layer because
# analyses/, planning/ and reports/ all state sizes in their messages and render/units.py re-exports it)

_IEC = (("EiB", 2 ** 60), ("PiB", 2 ** 50), ("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10))


def iec(n: float | int | None, digits: int = 2) -> str:
    """Bytes in IEC units (``1.50 GiB``; None: ``--``)."""
    if n is None:
        return "--"
    n = float(n)
    for unit, scale in _IEC:
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{int(n)} B"


_BYTE_UNITS = {"": 1, "b": 1, "k": 10 ** 3, "kb": 10 ** 3, "m": 10 ** 6, "mb": 10 ** 6, "g": 10 ** 9,
               "gb": 10 ** 9, "t": 10 ** 12, "tb": 10 ** 12, "kib": 2 ** 10, "mib": 2 ** 20,
               "gib": 2 ** 30, "tib": 2 ** 40}


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



def parse_dtype_name(value, what: str) -> torch.dtype:
    """A dtype from ``fp32``/``bf16``/``fp16`` (or their long names, or a torch.dtype)."""
    if isinstance(value, torch.dtype):
        return value
    found = DTYPES.get(str(value).lower().replace("torch.", ""))
    if found is None:
        raise InputError(f"{what} must be fp32, bf16 or fp16, got {value!r}")
    return found
