"""The argparse tree of every subcommand, and the arguments several of them share."""

from __future__ import annotations

import argparse

import torch

from ..costs.gpus import GPUS
from .flags import add_flags
from .argtypes import arg_count, arg_count_or_auto, arg_device, arg_dtype, arg_ints
from .helptext import _EXAMPLES, _SPEC_HELP, HelpFormatter


# every bad input exits 1 (a malformed command line too: one line, as for any other bad input); an
# internal error 3
EXIT_USAGE, EXIT_ERROR, EXIT_INTERNAL = 1, 1, 3
EXIT_BROKEN_PIPE = 141      # the reader closed the pipe: what a shell reports for a program SIGPIPE ended (cat, grep)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `layerscope: error: ...` and where the usage is, not the usage
    block (the README promises one line on stderr)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"layerscope: error: {message} (see `{self.prog} --help`)\n")


FORMATS = ("table", "json", "csv", "html")


def _output_args(s: argparse.ArgumentParser, formats=FORMATS) -> None:
    s.add_argument("--format", choices=formats, default="table",
                   help="table (terminal), json, csv" + (", html (the self-contained page)" if "html" in formats
                                                          else ""))
    s.add_argument("--output", "-o", help="write to this file instead of standard output")
    s.add_argument("--quiet", "-q", action="store_true", help="no spinner or progress bar on stderr")


def _input_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--input-size", type=arg_ints, action="append", metavar="1,3,224,224",
                   help="shape of an example input (repeat for several inputs)")
    s.add_argument("--input-ids", type=arg_ints, metavar="B,S", help="token ids of shape B,S (int64)")
    s.add_argument("--dtype", type=arg_dtype, action="append", help="dtype per --input-size (default float32)")
    s.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="config/factory override (repeatable; a key the config or factory lacks is refused;\n"
                        "text_config.KEY=VALUE sets a key of a sub-configuration)")
    s.add_argument("--model-dtype", choices=("bf16", "fp16", "fp32"),
                   help="dtype of the model's floating-point weights and buffers (default: as built, fp32\n"
                        "for hf: specs); parameter, gradient and optimizer-state bytes follow it")
    s.add_argument("--head", help="hf: model head: causal-lm, masked-lm, seq2seq-lm, seq-cls, token-cls, image-cls")
    s.add_argument("--allow-pickle", action="store_true",
                   help="load a .pt/.pth that is a pickled nn.Module (unpickling RUNS code from the file:\n"
                        "only for files you trust); without it only TorchScript and weights_only loads")
    s.add_argument("--trust-remote-code", action="store_true",
                   help="build an hf: config that names code of its own (auto_map: transformers'\n"
                        "trust_remote_code RUNS Python from the repository or directory: only for ones you\n"
                        "trust); without it such a config is refused, unless transformers knows its model_type")


def _model_args(s: argparse.ArgumentParser, formats=FORMATS) -> None:
    """Arguments every subcommand that builds a model shares."""
    s.add_argument("spec", help=_SPEC_HELP)
    _input_args(s)
    s.add_argument("--depth", type=arg_count(0), default=3, help="deepest layer level shown (default 3)")
    s.add_argument("--expand", action="store_true",
                   help="show every block of a run of identical blocks (folded by default: 'layers.0-79 x80')")
    _output_args(s, formats)


def _sub(sub, name: str, help_text: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help_text, description=help_text, epilog=_EXAMPLES[name],
                          formatter_class=HelpFormatter)


def _memory_args(m: argparse.ArgumentParser, optimizer_default: str | None = None) -> None:
    """A training step's flags, from MemoryOptions' field declarations (--momentum and --train/--infer,
    which the command turns into an optimizer and ``training``, are the CLI's own)."""
    from ..options import MemoryOptions
    add_flags(m, MemoryOptions, "optimizer", defaults={"optimizer": optimizer_default} if optimizer_default else None)
    m.add_argument("--momentum", type=float, help="momentum for --optimizer sgd")
    add_flags(m, MemoryOptions, "batch_size", "autocast_dtype")
    mode = m.add_mutually_exclusive_group()
    mode.add_argument("--train", dest="training", action="store_true", default=True,
                      help="a training step: forward, loss, backward, optimizer step (default)")
    mode.add_argument("--infer", dest="training", action="store_false", help="a no-grad forward")
    add_flags(m, MemoryOptions, "steps", "accumulation", "loss")


def _columns_help(columns) -> str:
    """--columns' help from the report kind's own column list (the one place columns are defined)."""
    import textwrap
    keys = ", ".join(c.key for c in columns)
    default = ",".join(c.key for c in columns if c.default)
    if len(default) > 60:
        default = f"the first {sum(c.default for c in columns)}"
    return "comma-separated, of:\n" + "\n".join(textwrap.wrap(keys, 72, break_on_hyphens=False)) + \
        f"\n(default {default})"


def _attention_args(p: argparse.ArgumentParser, cls) -> None:
    """--gpu and --attention, from the declarations of ``cls``'s fields (AnalyzeOptions, MemoryOptions)."""
    add_flags(p, cls, "gpu", "attention", gpus=", ".join(GPUS))


def build_parser() -> argparse.ArgumentParser:
    from ..reports.memory import COLUMNS as memory_columns
    from ..reports.summary import COLUMNS as summary_columns

    from ..options import AnalyzeOptions, MemoryOptions, OnnxOptions, ParallelOptions, ProfileOptions, TileOptions
    from ..planning.config import ParallelConfig, PartitionOptions

    from .._version import __version__
    p = _Parser(
        prog="layerscope", description="What is inside a PyTorch model, layer by layer.",
        epilog="run `layerscope COMMAND --help` for each command's options and examples",
        formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"layerscope {__version__} (torch {torch.__version__})")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    s = _sub(sub, "summary", "per-layer shapes, params, MACs, FLOPs, bytes")
    _model_args(s)
    add_flags(s, AnalyzeOptions, "device")
    s.add_argument("--columns", help=_columns_help(summary_columns))
    add_flags(s, AnalyzeOptions, "mode", "backward", "causal")
    _attention_args(s, AnalyzeOptions)
    add_flags(s, AnalyzeOptions)        # any flag field not placed above: a new option is its field alone
    o = _sub(sub, "onnx", "an ONNX model: the module tree and the per-node table (shapes, params, MACs, FLOPs, "
                          "bytes read/written)")
    o.add_argument("file", help="the .onnx file (external data is never read)")
    add_flags(o, OnnxOptions, "input_shapes")
    o.add_argument("--sort", choices=("order", "read", "write", "bytes", "macs", "flops", "params"),
                   default="order", help="order of the node table (default: graph order)")
    o.add_argument("--top", type=arg_count(1), help="only the first N rows of the node table")
    o.add_argument("--depth", type=arg_count(0), default=3, help="deepest module level shown (default 3)")
    o.add_argument("--expand", action="store_true", help="do not fold runs of identical blocks")
    _output_args(o)
    t = _sub(sub, "onnx-tile", "rewrite Gemm/MatMul nodes into M x K x N blocks (Split + blocks + Sum + Concat)")
    t.add_argument("file", help="the .onnx file to rewrite")
    t.add_argument("out", help="where to write the tiled model")
    add_flags(t, TileOptions, "block", "ops", "nodes", "input_shapes", "verify")
    t.add_argument("--quiet", "-q", action="store_true", help="no spinner on stderr")
    m = _sub(sub, "memory", "memory of a training step or inference: per category, peak, per layer")
    _model_args(m)
    add_flags(m, MemoryOptions, "device")
    _memory_args(m)
    add_flags(m, MemoryOptions, "limit", "measure")
    _attention_args(m, MemoryOptions)
    m.add_argument("--columns", help=_columns_help(memory_columns))
    add_flags(m, MemoryOptions)         # any flag field not placed above
    pl = _sub(sub, "parallel", "per-rank memory of sharded training (FSDP2, HSDP, tensor parallel, checkpointing), "
                               "simulated with torch's own distributed code on one CPU")
    pl.add_argument("spec", help=_SPEC_HELP)
    _input_args(pl)
    # the flags of parallel()'s options and of the configuration, each from its field's declaration
    # (options.ParallelOptions, planning.config.ParallelConfig); the names here only lay out the help
    gpus = ", ".join(GPUS)
    add_flags(pl, ParallelConfig, "gpus", "gpus_per_node")
    add_flags(pl, ParallelOptions, "gpu", "memory_limit", gpus=gpus)
    add_flags(pl, ParallelConfig)                   # the rest of the configuration
    add_flags(pl, ParallelOptions, "optimizer", "loss", "steps")
    pl.add_argument("--run", action="store_true",
                    help="also train the configuration for real under torchrun on this machine (gloo, CPU\n"
                         "ranks; --device cpu) and compare each rank's peak and the losses; with --search,\n"
                         "the configuration it chose")
    add_flags(pl, ParallelOptions)                  # the rest: --device, --search, --search-limit, --fraction
    _output_args(pl)
    pl.set_defaults(depth=None)
    pf = _sub(sub, "profile", "per-module forward (and backward) time, self and inclusive, achieved FLOP/s")
    _model_args(pf)
    add_flags(pf, ProfileOptions, "device", "backward", "repeats", "warmup", "roofline")
    pf.add_argument("--top", type=arg_count(0), default=3, metavar="K",
                    help="name the K slowest calls at each depth under the table (default 3; 0: none)")
    pf.add_argument("--columns", help="comma-separated, of: output_shape, input_shape, params, forward, forward_self,\n"
                                      "self_percent, forward_p25, forward_p75, backward, backward_self (with\n"
                                      "--backward), flops, bytes_moved, flops_per_second, intensity, bound,\n"
                                      "roof_fraction (with --roofline)")
    pf.add_argument("--trace", metavar="FILE.json",
                    help="also write a Chrome trace / Perfetto JSON of the module spans of one repeat")
    add_flags(pf, ProfileOptions)       # any flag field not placed above
    sp = _sub(sub, "split", "optimal pipeline stages; --run trains them under torchrun")
    _model_args(sp)
    _split_args(sp)
    sp.add_argument("--run", action="store_true",
                    help="train the stages under torchrun (gloo on CPU) and compare with one process")
    add_flags(sp, PartitionOptions, "steps")
    add_flags(sp, PartitionOptions)     # any flag field not placed above
    r = _sub(sub, "report", "one self-contained HTML page: layer tree, charts of MACs, params, memory and "
                            "latency, the memory timeline, the stage split, coverage")
    r.add_argument("spec", nargs="+", help=_SPEC_HELP + "\n  or one or more saved JSON reports (--format json)")
    _input_args(r)
    r.add_argument("--output", "-o", required=True, help="the .html file to write")
    r.add_argument("--title", help="page title (default: layerscope: MODEL)")
    r.add_argument("--device", type=arg_device, help="where to build and run the model (hf: specs are built on meta)")
    r.add_argument("--no-memory", dest="memory", action="store_false", help="leave out the memory section")
    _memory_args(r, optimizer_default="adamw")
    _attention_args(r, MemoryOptions)
    r.add_argument("--profile", action="store_true", help="also time every layer (needs real weights: "
                                                          "the model is built on cpu)")
    # 10 fixed, as before: on a 2-core shared machine auto runs to its maximum of 20 (twice the time)
    r.add_argument("--repeats", type=arg_count_or_auto(1), default=10,
                   help="timed repeats for --profile (default 10), or auto (as for `profile`: 6-20)")
    r.add_argument("--stages", type=arg_count(1), help="also plan this many pipeline stages")
    r.add_argument("--by", choices=("flops", "macs", "params", "memory", "latency"), default="flops",
                   help="the stage cost to balance (default flops)")
    r.add_argument("--quiet", "-q", action="store_true", help="no spinner or progress bar on stderr")
    c = _sub(sub, "compare", "two models, or two saved JSON reports, layer by layer: params, MACs, FLOPs, "
                             "memory, latency, and the difference")
    c.add_argument("a", help="a model spec (as for summary) or a saved JSON report")
    c.add_argument("b", help="the other one")
    _input_args(c)
    c.add_argument("--device", type=arg_device, help="where to build the models (hf: specs are built on meta)")
    c.add_argument("--depth", type=arg_count(0), default=2, help="deepest layer level shown (default 2)")
    c.add_argument("--changed", action="store_true", help="only the layers that differ")
    c.add_argument("--expand", action="store_true",
                   help="show every block of a run of identical blocks (folded by default: 'h.0-23 x24')")
    c.add_argument("--memory", action="store_true", help="specs: also compare a training step's memory per layer "
                                                         "(AdamW)")
    c.add_argument("--profile", action="store_true", help="specs: also compare per-layer times (built on cpu)")
    _output_args(c, ("table", "json", "csv"))
    lp = _sub(sub, "list-presets", "the architectures shipped as configs, for hf:NAME")
    _output_args(lp, ("table", "json", "csv"))
    return p


def _split_args(sp: argparse.ArgumentParser) -> None:
    """split's flags, each from its PartitionOptions field's declaration (planning/config.py); the
    names only lay out the help (--steps, --run's, follows --run)."""
    from ..planning.config import PartitionOptions
    add_flags(sp, PartitionOptions, "stages", "by", "objective", "roofline", "link_bandwidth", "optimizer_bandwidth",
              "schedule", "microbatches", "batch_size", "optimizer", "memory_limit", "device", "stages_per_rank",
              "return_outputs")
