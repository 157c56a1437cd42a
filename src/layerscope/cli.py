"""`layerscope ...` command line. The only place that prints or exits."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Sequence

import torch

from .errors import LayerscopeError

# every bad input exits 1 (a malformed command line too: one line, as for any other bad input); an
# internal error 3
EXIT_USAGE, EXIT_ERROR, EXIT_INTERNAL = 1, 1, 3

_SPEC_HELP = """model spec, one of:
  path/to/file.py:factory   imports and RUNS that file (it is your code: only use files you trust),
                            then calls factory()
  package.module:factory    e.g. layerscope.examples:small_cnn
  hf:PRESET                 a shipped architecture (built on meta unless --device): gpt2, bert-base,
                            llama-2-70b, mixtral-8x7b, ... (layerscope list-presets)
  hf:ConfigClass[:Model]    a transformers config with defaults (built on meta unless --device),
                            e.g. hf:GPT2Config, hf:BertConfig:BertForMaskedLM
  torchvision:name          e.g. torchvision:resnet50 (needs torchvision)
  timm:name                 e.g. timm:vit_base_patch16_224 (needs timm)
  model.onnx                an ONNX model (summary; `layerscope onnx` for its node table)
  model.pt                  a TorchScript archive (torch.jit.load; summary only; give --input-size);
                            a pickled nn.Module only with --allow-pickle (that runs code from the file)"""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors: `layerscope: error: ...` and where the usage is, not the usage
    block (the README promises one line on stderr)."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(EXIT_USAGE, f"layerscope: error: {message} (see `{self.prog} --help`)\n")


def _ints(text: str) -> tuple[int, ...]:
    # every item must be an integer: "1,3,x,32" was read as 1,3,32 when "x" doubled as a separator
    import re
    parts = re.split(r"[,x]", text.strip())
    try:
        vals = tuple(int(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,3,224,224, got {text!r}")
    if not vals or any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected non-negative integers like 1,3,224,224, got {text!r}")
    return vals


def _count(least: int):
    """An integer option that must be at least ``least`` (--stages 0, --microbatches -1 are refused
    here, before anything runs, instead of failing deep inside as a ZeroDivisionError)."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}")
        if v < least:
            raise argparse.ArgumentTypeError(f"must be at least {least}, got {v}")
        return v
    parse.__name__ = "int"
    return parse


def _count_or_auto(least: int):
    """--repeats/--warmup: ``auto`` (profile() chooses from the measured spread) or an integer of
    at least ``least``."""
    count = _count(least)

    def parse(text: str):
        if text.strip().lower() == "auto":
            return "auto"
        try:
            int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer or auto, got {text!r}")
        return count(text)
    parse.__name__ = "int or auto"
    return parse


def _device(text: str) -> str:
    try:
        torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown device {text!r} (cpu, cuda, cuda:1, meta)")
    return text


def _dtype(text: str) -> torch.dtype:
    dt = getattr(torch, text, None)
    if not isinstance(dt, torch.dtype):
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r} (e.g. float32, bfloat16, int64)")
    return dt


FORMATS = ("table", "json", "csv", "html")


def _output_args(s: argparse.ArgumentParser, formats=FORMATS) -> None:
    s.add_argument("--format", choices=formats, default="table",
                   help="table (terminal), json, csv" + (", html (the self-contained page)" if "html" in formats
                                                          else ""))
    s.add_argument("--output", "-o", help="write to this file instead of standard output")
    s.add_argument("--quiet", "-q", action="store_true", help="no spinner or progress bar on stderr")


def _input_args(s: argparse.ArgumentParser) -> None:
    s.add_argument("--input-size", type=_ints, action="append", metavar="1,3,224,224",
                   help="shape of an example input (repeat for several inputs)")
    s.add_argument("--input-ids", type=_ints, metavar="B,S", help="token ids of shape B,S (int64)")
    s.add_argument("--dtype", type=_dtype, action="append", help="dtype per --input-size (default float32)")
    s.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="config/factory override (repeatable; a key the config or factory lacks is refused)")
    s.add_argument("--model-dtype", choices=("bf16", "fp16", "fp32"),
                   help="dtype of the model's floating-point weights and buffers (default: as built, fp32\n"
                        "for hf: specs); parameter, gradient and optimizer-state bytes follow it")
    s.add_argument("--head", help="hf: model head: causal-lm, masked-lm, seq2seq-lm, seq-cls, token-cls, image-cls")
    s.add_argument("--allow-pickle", action="store_true",
                   help="load a .pt/.pth that is a pickled nn.Module (unpickling RUNS code from the file:\n"
                        "only for files you trust); without it only TorchScript and weights_only loads")


def _model_args(s: argparse.ArgumentParser, formats=FORMATS) -> None:
    """Arguments every subcommand that builds a model shares."""
    s.add_argument("spec", help=_SPEC_HELP)
    _input_args(s)
    s.add_argument("--depth", type=_count(0), default=3, help="deepest layer level shown (default 3)")
    s.add_argument("--expand", action="store_true",
                   help="show every block of a run of identical blocks (folded by default: 'layers.0-79 x80')")
    _output_args(s, formats)


_EXAMPLES = {
    "summary": """examples:
  layerscope summary layerscope.examples:small_cnn --columns input_shape,output_shape,params,kernel,macs
  layerscope summary hf:llama-2-70b --depth 2                  # on meta: nothing is allocated
  layerscope summary hf:llama-2-7b --model-dtype bf16 --depth 1   # weights in bf16: Params size 12.55 GiB
  layerscope summary hf:gpt2 --input-ids 4,512 --backward --format json -o gpt2.json
  layerscope summary path/to/net.py:build --input-size 1,3,224,224 --format html -o net.html""",
    "memory": """examples:
  layerscope memory hf:gpt2 --input-ids 8,1024 --optimizer adamw --autocast bf16
  layerscope memory hf:llama-2-70b --input-ids 1,4096 --optimizer adamw --device cuda --limit 80GiB
  layerscope memory layerscope.examples:small_cnn --infer --batch-size 64""",
    "profile": """examples:
  layerscope profile layerscope.examples:tiny_gpt --backward --repeats 50
  layerscope profile hf:GPT2Config --set n_layer=2 --input-ids 1,128 --roofline measure --trace gpt2.json""",
    "split": """examples:
  layerscope split hf:GPT2Config --head causal-lm --set n_layer=4 --input-ids 8,64 --stages 2
  layerscope split layerscope.examples:tiny_gpt --stages 2 --by roofline --roofline 1e11,1e10
  layerscope split layerscope.examples:tiny_gpt --stages 2 --schedule gpipe --microbatches 4 --run
  layerscope split hf:llama-2-70b --model-dtype bf16 --input-ids 8,1024 --stages 16 --memory-limit 80GiB --device cuda

--run starts torchrun with one process per stage (the model is rebuilt in each from SPEC and --set).""",
    "onnx": """examples:
  layerscope onnx model.onnx --input batch=1 --sort bytes --top 20
  layerscope onnx model.onnx --input input_ids=1,128 --format json -o report.json""",
    "onnx-tile": """examples:
  layerscope onnx-tile model.onnx tiled.onnx --block 64,64,64 --verify
  layerscope onnx-tile model.onnx tiled.onnx --nodes /fc1/Gemm,/fc2/Gemm --block 128,128,128""",
    "report": """examples:
  layerscope report layerscope.examples:tiny_gpt -o report.html --profile --stages 2
  layerscope report hf:llama-3-8b --input-ids 1,2048 --stages 4 -o llama3.html
  layerscope report gpt2.json gpt2-memory.json -o gpt2.html      # saved JSON reports, on one page""",
    "compare": """examples:
  layerscope compare hf:gpt2 hf:gpt2-medium --depth 1
  layerscope compare before.json after.json --changed               # saved JSON reports
  layerscope compare hf:llama-2-7b hf:mistral-7b --input-ids 1,1024 --format csv -o diff.csv""",
    "list-presets": """examples:
  layerscope list-presets
  layerscope summary hf:mixtral-8x7b --depth 2""",
}


def _sub(sub, name: str, help_text: str) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help_text, description=help_text, epilog=_EXAMPLES[name],
                          formatter_class=argparse.RawTextHelpFormatter)


def _memory_args(m: argparse.ArgumentParser, optimizer_default: str | None = None) -> None:
    m.add_argument("--optimizer", default=optimizer_default,
                   help="a torch.optim class name: adamw, adam, sgd, adagrad, rmsprop, ..."
                        + (f" (default {optimizer_default})" if optimizer_default else ""))
    m.add_argument("--momentum", type=float, help="momentum for --optimizer sgd")
    m.add_argument("--batch-size", type=_count(1), help="re-size the inputs' batch dimension to N")
    m.add_argument("--autocast", choices=("bf16", "fp16"), help="run forward and loss under torch.autocast")
    mode = m.add_mutually_exclusive_group()
    mode.add_argument("--train", dest="training", action="store_true", default=True,
                      help="a training step: forward, loss, backward, optimizer step (default)")
    mode.add_argument("--infer", dest="training", action="store_false", help="a no-grad forward")
    m.add_argument("--steps", type=_count(1), default=2, help="training steps to run (default 2)")
    m.add_argument("--accumulation", type=_count(1), default=1, help="micro-batches per step (default 1)")


def _columns_help(columns) -> str:
    """--columns' help from the report kind's own column list (the one place columns are defined)."""
    import textwrap
    keys = ", ".join(c.key for c in columns)
    default = ",".join(c.key for c in columns if c.default)
    if len(default) > 60:
        default = f"the first {sum(c.default for c in columns)}"
    return "comma-separated, of:\n" + "\n".join(textwrap.wrap(keys, 72, break_on_hyphens=False)) + \
        f"\n(default {default})"


def _parser() -> argparse.ArgumentParser:
    from .reports.memory import COLUMNS as memory_columns
    from .reports.summary import COLUMNS as summary_columns

    from ._version import __version__
    p = _Parser(
        prog="layerscope", description="What is inside a PyTorch model, layer by layer.",
        epilog="run `layerscope COMMAND --help` for each command's options and examples")
    p.add_argument("--version", action="version", version=f"layerscope {__version__} (torch {torch.__version__})")
    sub = p.add_subparsers(dest="command", required=True)
    s = _sub(sub, "summary", "per-layer shapes, params, MACs, FLOPs, bytes")
    _model_args(s)
    s.add_argument("--device", type=_device, help="cpu, cuda, or meta (count without computing)")
    s.add_argument("--columns", help=_columns_help(summary_columns))
    s.add_argument("--mode", choices=("eval", "train", "same"), default="eval")
    s.add_argument("--backward", action="store_true", help="also run and count a backward pass")
    s.add_argument("--causal", choices=("dense", "unmasked"), default="dense",
                   help="count causal attention densely (default) or only its unmasked part")
    o = _sub(sub, "onnx", "an ONNX model: the module tree and the per-node table (shapes, params, MACs, FLOPs, "
                          "bytes read/written)")
    o.add_argument("file", help="the .onnx file (external data is never read)")
    o.add_argument("--input", action="append", metavar="NAME=DIMS",
                   help="an input's shape (input_ids=1,128) or a symbolic dim's value (batch=8); repeatable")
    o.add_argument("--sort", choices=("order", "read", "write", "bytes", "macs", "flops", "params"),
                   default="order", help="order of the node table (default: graph order)")
    o.add_argument("--top", type=_count(1), help="only the first N rows of the node table")
    o.add_argument("--depth", type=_count(0), default=3, help="deepest module level shown (default 3)")
    o.add_argument("--expand", action="store_true", help="do not fold runs of identical blocks")
    _output_args(o)
    t = _sub(sub, "onnx-tile", "rewrite Gemm/MatMul nodes into M x K x N blocks (Split + blocks + Sum + Concat)")
    t.add_argument("file", help="the .onnx file to rewrite")
    t.add_argument("out", help="where to write the tiled model")
    t.add_argument("--block", type=_ints, default=(64, 64, 64), metavar="M,K,N", help="block sizes (default 64,64,64)")
    t.add_argument("--ops", default="Gemm,MatMul", help="node types to tile (default Gemm,MatMul)")
    t.add_argument("--nodes", help="only these nodes (comma-separated names)")
    t.add_argument("--input", action="append", metavar="NAME=DIMS", help="as for `layerscope onnx`")
    t.add_argument("--verify", action="store_true",
                   help="run both models in onnxruntime on random inputs and report the max abs error and MSE")
    t.add_argument("--quiet", "-q", action="store_true", help="no spinner on stderr")
    m = _sub(sub, "memory", "memory of a training step or inference: per category, peak, per layer")
    _model_args(m)
    m.add_argument("--device", type=_device, help="the device to predict for: cpu or cuda (512-byte allocator blocks); "
                                    "default where the model is (hf: specs are built on meta)")
    _memory_args(m)
    m.add_argument("--limit", help="memory limit such as 80GiB: says whether the peak fits, and the "
                                   "largest batch that does")
    m.add_argument("--measure", action="store_true", help="also run the real step and measure it")
    m.add_argument("--columns", help=_columns_help(memory_columns))
    pf = _sub(sub, "profile", "per-module forward (and backward) time, self and inclusive, achieved FLOP/s")
    _model_args(pf)
    pf.add_argument("--device", type=_device, help="where to build the model and run it: cpu (default) or cuda")
    pf.add_argument("--backward", action="store_true", help="also time the backward pass")
    pf.add_argument("--repeats", type=_count_or_auto(1), default="auto",
                    help="timed repeats, or auto (the default): 6 to 20, stopping when every median that\n"
                         "matters is known within +-2%% (whole run) / +-5%% (calls over 5%% of it), 95%% confidence")
    pf.add_argument("--warmup", type=_count_or_auto(0), default="auto",
                    help="untimed warm-up runs, or auto (the default): 1 to 3, more while runs get faster")
    pf.add_argument("--roofline", metavar="PEAKS",
                    help="class each layer compute- or memory-bound and show its distance from the roof:\n"
                         "a GPU from the built-in table (V100, A100, A100-40GB, L4, H100, H100-PCIE, H200),\n"
                         "'measure' (a short matmul and copy microbenchmark here), 'auto' (the table\n"
                         "for a known GPU, else measured) or 'FLOPS,BYTES_PER_S' such as 989e12,3.35e12")
    pf.add_argument("--top", type=_count(0), default=3, metavar="K",
                    help="name the K slowest calls at each depth under the table (default 3; 0: none)")
    pf.add_argument("--columns", help="comma-separated, of: output_shape,input_shape,params,forward,forward_self,\n"
                                      "self_percent,forward_p25,forward_p75,backward,backward_self (with\n"
                                      "--backward),flops,bytes_moved,flops_per_second,intensity,bound,\n"
                                      "roof_fraction (with --roofline)")
    pf.add_argument("--trace", metavar="FILE.json",
                    help="also write a Chrome trace / Perfetto JSON of the module spans of one repeat")
    sp = _sub(sub, "split", "optimal pipeline stages; --run trains them under torchrun")
    _model_args(sp)
    _split_args(sp)
    sp.add_argument("--run", action="store_true",
                    help="train the stages under torchrun (gloo on CPU) and compare with one process")
    sp.add_argument("--steps", type=_count(1), default=3, help="training steps for --run (default 3)")
    r = _sub(sub, "report", "one self-contained HTML page: layer tree, charts of MACs, params, memory and "
                            "latency, the memory timeline, the stage split, coverage")
    r.add_argument("spec", nargs="+", help=_SPEC_HELP + "\n  or one or more saved JSON reports (--format json)")
    _input_args(r)
    r.add_argument("--output", "-o", required=True, help="the .html file to write")
    r.add_argument("--title", help="page title (default: layerscope: MODEL)")
    r.add_argument("--device", type=_device, help="where to build and run the model (hf: specs are built on meta)")
    r.add_argument("--no-memory", dest="memory", action="store_false", help="leave out the memory section")
    _memory_args(r, optimizer_default="adamw")
    r.add_argument("--profile", action="store_true", help="also time every layer (needs real weights: "
                                                          "the model is built on cpu)")
    # 10 fixed, as before: on a 2-core shared machine auto runs to its maximum of 20 (twice the time)
    r.add_argument("--repeats", type=_count_or_auto(1), default=10,
                   help="timed repeats for --profile (default 10), or auto (as for `profile`: 6-20)")
    r.add_argument("--stages", type=_count(1), help="also plan this many pipeline stages")
    r.add_argument("--by", choices=("flops", "macs", "params", "memory", "latency"), default="flops",
                   help="the stage cost to balance (default flops)")
    r.add_argument("--quiet", "-q", action="store_true", help="no spinner or progress bar on stderr")
    c = _sub(sub, "compare", "two models, or two saved JSON reports, layer by layer: params, MACs, FLOPs, "
                             "memory, latency, and the difference")
    c.add_argument("a", help="a model spec (as for summary) or a saved JSON report")
    c.add_argument("b", help="the other one")
    _input_args(c)
    c.add_argument("--device", type=_device, help="where to build the models (hf: specs are built on meta)")
    c.add_argument("--depth", type=_count(0), default=2, help="deepest layer level shown (default 2)")
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
    from .options import SCHEDULES
    sp.add_argument("--stages", type=_count(1), required=True, help="number of pipeline stages")
    sp.add_argument("--by", choices=("flops", "macs", "params", "memory", "latency", "roofline"), default="flops",
                    help="the stage cost (default flops, forward + backward); latency: forward and backward\n"
                         "times measured here (real weights), roofline: predicted from FLOPs and bytes\n"
                         "(--roofline): with either the plan predicts the step time and draws the step")
    sp.add_argument("--objective", choices=("step_time", "bottleneck", "uniform"),
                    help="what the split minimises: step_time (the schedule's simulated step; the default\n"
                         "with --by latency or roofline), bottleneck (the largest stage cost; the default\n"
                         "otherwise) or uniform (equal repeated blocks per stage: torchtitan's default)")
    sp.add_argument("--roofline", metavar="PEAKS",
                    help="peaks for --by roofline: a GPU of the built-in table (H100, A100, ...),\n"
                         "'FLOPS,BYTES_PER_S', or 'measure' (default: measured on this machine on cpu)")
    sp.add_argument("--link-bandwidth", type=_bandwidth, metavar="BYTES_PER_S",
                    help="price each send across a cut at this bandwidth (e.g. 50e9 or 50GB/s)")
    sp.add_argument("--optimizer-bandwidth", type=_bandwidth, metavar="BYTES_PER_S",
                    help="price each rank's optimizer step at this memory bandwidth (e.g. 2e12)")
    sp.add_argument("--schedule", choices=tuple(SCHEDULES), default="1f1b",
                    help="pipeline schedule (default 1f1b): torch's ScheduleGPipe, Schedule1F1B,\n"
                         "ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble (zb) or\n"
                         "ScheduleZBVZeroBubble (zbv: 2 stages per rank in a V)")
    sp.add_argument("--microbatches", type=_count(1), default=4,
                    help="micro-batches the batch is split into (default 4)")
    sp.add_argument("--batch-size", type=_count(1), default=8,
                    help="the whole batch, split into micro-batches (default 8: the inputs' batch\n"
                         "dimension is re-sized to it, also that of --input-ids/--input-size)")
    sp.add_argument("--optimizer", default="adamw", help="optimizer whose state each stage holds (default adamw)")
    sp.add_argument("--memory-limit", help="per-stage memory limit such as 16GiB")
    sp.add_argument("--device", type=_device, help="the device to plan for (cpu or cuda)")
    sp.add_argument("--stages-per-rank", type=_count(2), default=2,
                    help="stages on each rank under --schedule interleaved or zb (default 2; --run starts\n"
                         "stages / stages-per-rank processes)")
    sp.add_argument("--return-outputs", action=argparse.BooleanOptionalAction, default=None,
                    help="plan for schedule.step(..., return_outputs=True): the last stage keeps every\n"
                         "micro-batch's output (torch's default, and the default; --no-return-outputs\n"
                         "plans for step(..., return_outputs=False))")


def _bandwidth(text: str) -> float:
    """'50e9', '50GB/s', '2.5TB/s' -> bytes per second (parsed in options, as a usage error here)."""
    from .options import parse_bandwidth
    try:
        return parse_bandwidth(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _split_options(ns: argparse.Namespace) -> dict:
    """split's options by their PartitionOptions names (those given), for partition() and for
    every rank of a --run."""
    out = {"stages": ns.stages, "by": ns.by, "memory_limit": ns.memory_limit, "schedule": ns.schedule,
           "microbatches": ns.microbatches, "optimizer": ns.optimizer, "device": ns.device,
           "stages_per_rank": ns.stages_per_rank, "return_outputs": ns.return_outputs is not False,
           "objective": ns.objective, "roofline": ns.roofline, "link_bandwidth": ns.link_bandwidth,
           "optimizer_bandwidth": ns.optimizer_bandwidth}
    return {k: v for k, v in out.items() if v is not None}


def _split(ns: argparse.Namespace) -> int:
    from .api import partition
    from .capture.prepare import rebatch
    from .options import SCHEDULES, PartitionOptions
    from .specs import parse_overrides

    if ns.run:
        from .torchrun import launch
        # every rank rebuilds the model and its inputs from these options (specs.command_inputs)
        _check_device(ns.device)
        procs = SCHEDULES[ns.schedule].ranks(ns.stages, ns.stages_per_rank)
        with _status(f"training {ns.stages} stages on {procs} ranks under torchrun", ns):
            res = launch(ns.spec, overrides=parse_overrides(ns.set), batch_size=ns.batch_size, steps=ns.steps,
                         head=ns.head, input_size=ns.input_size, dtypes=ns.dtype, input_ids=ns.input_ids,
                         model_dtype=ns.model_dtype, allow_pickle=ns.allow_pickle,
                         **{**_split_options(ns), "device": ns.device or "cpu"})
        text = res.plan.table() + "\n" + res.table()
        return _write(ns, text)
    model, args, kwargs = _build(ns, None if ns.device == "cuda" else ns.device)
    args, kwargs = rebatch(args, kwargs, 0, ns.batch_size)
    with _status("planning", ns):
        plan = partition(model, *args, options=PartitionOptions(**_split_options(ns)), **kwargs)
    return _emit(ns, plan)


def _write(ns: argparse.Namespace, text: str) -> int:
    if ns.output:
        from .errors import InputError
        try:
            with open(ns.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise InputError(f"cannot write {ns.output}: {e.strerror}") from e
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def _live(ns: argparse.Namespace) -> bool:
    """Spinners and progress bars: only on a terminal, and not with --quiet."""
    return sys.stderr.isatty() and not getattr(ns, "quiet", False)


def _status(text: str, ns: argparse.Namespace | None = None):
    """A spinner on stderr while work runs, only when stderr is a terminal (and not --quiet)."""
    if not sys.stderr.isatty() or getattr(ns, "quiet", False):
        return contextlib.nullcontext()
    return _spinner(text)


@contextlib.contextmanager
def _spinner(text: str):
    """rich's status spinner, with its refresh thread made known to the profiler's stderr
    hold-back (capture/measure.py): that thread only draws the spinner, so kineto's start and stop
    lines can still be held back while it runs (what it draws meanwhile is passed on)."""
    import threading

    from rich.console import Console

    from .capture.measure import quiet_safe_threads
    before = set(threading.enumerate())
    with Console(stderr=True).status(text):
        mine = [t for t in threading.enumerate() if t not in before]
        with quiet_safe_threads(mine):
            yield


# What each saved-model format supports, for the commands that need a PyTorch module to run.
_FILE_SUPPORT = {
    "pt2": "a torch.export program (.pt2) supports `summary` only (its graph runs forward as exported, on "
           "CPU or --device meta): memory, profile, split, report and compare need the Python model "
           "(path/to/file.py:factory, package.module:factory or hf:...)",
    "onnx": "an ONNX file supports `summary` and `layerscope onnx`/`onnx-tile` (a graph: no training "
            "step, timing or stage split)",
    "torchscript": "a TorchScript file supports `summary` only (forward, on CPU, with --input-size): "
                   "memory, profile, split, report and compare need the Python model (path/to/file.py:"
                   "factory, package.module:factory or hf:...)",
}


def _check_device(device: str | None) -> None:
    """A device the command will allocate on must exist here: one line instead of torch's
    `AssertionError: Torch not compiled with CUDA enabled` from inside the model's factory."""
    from .errors import InputError
    if not device:
        return
    dev = torch.device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            why = "this torch has no CUDA build" if torch.version.cuda is None else "no CUDA GPU is visible"
            raise InputError(f"--device {device}: {why}; use --device cpu, or --device meta to count "
                             "without allocating")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"--device {device}: there are {torch.cuda.device_count()} CUDA device(s)")
    elif dev.type not in ("cpu", "meta"):
        try:
            torch.empty(0, device=dev)
        except Exception as e:  # noqa: BLE001 - any backend's "not available" message
            raise InputError(f"--device {device} is not usable here ({type(e).__name__})") from None


def _input_bytes(ns: argparse.Namespace) -> int:
    """Bytes the example inputs given on the command line will take (before allocating them)."""
    import math
    total = 0
    dtypes = list(ns.dtype or [])
    for i, shape in enumerate(ns.input_size or []):
        dt = dtypes[i] if i < len(dtypes) else (dtypes[0] if len(dtypes) == 1 else torch.float32)
        total += math.prod(shape) * (torch.empty(0, dtype=dt).element_size())
    if ns.input_ids:
        total += 2 * math.prod(ns.input_ids) * 8      # input ids, and decoder ids for an encoder-decoder
    return total


def _check_memory(ns: argparse.Namespace, device: str | None) -> None:
    """Refuse before allocating what cannot fit: the weights (counted on meta first, for the specs
    layerscope builds itself: hf:, torchvision:, timm:) and the command-line inputs, against the
    memory available on the device (MemAvailable; cuda: mem_get_info). User factories are not
    built twice: their code runs once, where they put it."""
    from .specs import build_model, check_fits, parse_overrides, weight_bytes
    if device is None and ns.spec.startswith("hf:"):
        return                                   # hf: specs build on meta unless a device is given
    dev = device or "cpu"
    if torch.device(dev).type == "meta":
        return
    need = _input_bytes(ns)
    weights = 0
    if ns.spec.startswith(("hf:", "torchvision:", "timm:")):
        meta = build_model(ns.spec, "meta", parse_overrides(ns.set), ns.head, dtype=ns.model_dtype)
        weights = weight_bytes(meta.model)
        del meta
    need += weights
    counts_on_meta = ns.command in ("summary", "memory", "split", "compare", "report") and not \
        getattr(ns, "profile", False) and not getattr(ns, "measure", False)
    fixes = (["count on meta instead (--device meta, nothing allocated)"] if counts_on_meta else []) + \
        (["a smaller preset (layerscope list-presets)", "fewer layers (--set num_hidden_layers=2)"]
         + (["--model-dtype bf16"] if ns.model_dtype in (None, "fp32") else []) if weights else []) + \
        (["smaller inputs"] if need > weights else [])
    hint = "; ".join(fixes)
    what = f"{ns.spec} ({'weights' if weights else ''}{' and ' if weights and need > weights else ''}" \
           f"{'inputs' if need > weights else ''})"
    check_fits(need, dev, what, hint)


def _build(ns: argparse.Namespace, device: str | None):
    """The model and example inputs a subcommand asked for: (model, args, kwargs)."""
    from .capture import model_device
    from .errors import InputError
    from .specs import build_model, command_inputs, parse_overrides

    for ext in ("onnx", "pt2"):
        if ns.spec.endswith("." + ext):
            raise InputError(f"{ns.command} {ns.spec}: {_FILE_SUPPORT[ext]}")
    _check_device(device)
    _check_memory(ns, device)
    with _status(f"building {ns.spec}", ns):
        built = build_model(ns.spec, device, parse_overrides(ns.set), ns.head,
                            allow_pickle=getattr(ns, "allow_pickle", False), dtype=ns.model_dtype)
    model = built.model
    if isinstance(model, torch.jit.ScriptModule) and ns.command != "summary":
        raise InputError(f"{ns.command} {ns.spec}: {_FILE_SUPPORT['torchscript']}")
    dev = torch.device(device) if device else model_device(model)
    args, kwargs = command_inputs(ns.spec, model, built.default_inputs, dev, ns.input_size, ns.dtype,
                                  ns.input_ids)
    return model, args, kwargs


def _emit(ns: argparse.Namespace, rep) -> int:
    if ns.format == "json":
        text = rep.to_json()
    elif ns.format == "csv":
        text = rep.to_csv()
    elif ns.format == "html":
        text = rep.to_html()
    else:
        view = {"depth": ns.depth, **({"columns": ns.columns} if hasattr(ns, "columns") else {}),
                **({"top": ns.top} if hasattr(ns, "top") else {}),
                **({"fold": not ns.expand} if getattr(ns, "expand", None) is not None else {})}
        if ns.output is None:
            rep.print(**view)
            return 0
        text = rep.table(**view)
    return _write(ns, text)


def _summary(ns: argparse.Namespace) -> int:
    from .api import analyze
    from .options import AnalyzeOptions

    if ns.spec.endswith(".onnx"):
        from .api import analyze_onnx
        from .errors import InputError
        if ns.input_size or ns.input_ids or ns.set or ns.backward or ns.model_dtype:
            raise InputError("an ONNX file's input shapes come from the file: use `layerscope onnx FILE "
                             "--input NAME=DIMS` to set them")
        with _status(f"analysing {ns.spec}", ns):
            return _emit(ns, analyze_onnx(ns.spec))
    if ns.spec.endswith(".pt2"):   # issue 22: a torch.export program (torch.export.load, no pickle)
        from .api import analyze_exported
        from .errors import InputError
        if ns.input_ids or ns.set or ns.backward:
            raise InputError("a .pt2 program runs forward only on its own inputs: give --input-size (or none "
                             "to use the example inputs stored in it)")
        with _status(f"analysing {ns.spec}", ns):
            return _emit(ns, analyze_exported(ns.spec, input_size=ns.input_size or None,
                                              dtypes=ns.dtype or None, device=ns.device, causal=ns.causal))
    model, args, kwargs = _build(ns, ns.device)
    if isinstance(model, torch.jit.ScriptModule):
        from .api import analyze_torchscript
        from .errors import InputError
        if kwargs or ns.backward or ns.device not in (None, "cpu"):
            raise InputError("a TorchScript file is analysed on CPU, forward only, with positional inputs "
                             "(--input-size)")
        with _status("analysing", ns):
            rep = analyze_torchscript(model, *args)
        return _emit(ns, rep)
    with _status("analysing", ns):
        rep = analyze(model, *args, options=AnalyzeOptions(device=ns.device, mode=ns.mode, backward=ns.backward,
                                                           causal=ns.causal), forward_kwargs=kwargs)
    return _emit(ns, rep)


def _memory(ns: argparse.Namespace) -> int:
    import functools

    import dataclasses

    from .api import max_batch_size, memory
    from .options import MemoryOptions, optimizer_factory
    from .errors import InputError
    from .render.units import iec

    # hf: specs and factories are built where the model will live; a cuda prediction is simulated
    build_on = ns.device if ns.measure else (None if ns.device in (None, "cuda") else ns.device)
    model, args, kwargs = _build(ns, build_on)
    optimizer = optimizer_factory(ns.optimizer) if ns.optimizer else None
    if ns.momentum is not None:
        if optimizer is not torch.optim.SGD:
            raise InputError("--momentum applies to --optimizer sgd")
        optimizer = functools.partial(torch.optim.SGD, momentum=ns.momentum)
    step = MemoryOptions(optimizer=optimizer, training=ns.training, autocast_dtype=ns.autocast, device=ns.device,
                         steps=ns.steps, accumulation=ns.accumulation)
    with _status("simulating the step", ns):
        rep = memory(model, *args, options=dataclasses.replace(step, batch_size=ns.batch_size, limit=ns.limit,
                                                               measure=ns.measure or None), forward_kwargs=kwargs)
    code = _emit(ns, rep)
    if ns.limit and ns.format == "table":
        try:
            with _status("finding the largest batch that fits", ns):
                fit = max_batch_size(model, *args, limit=ns.limit, options=step, forward_kwargs=kwargs)
        except LayerscopeError as e:
            sys.stdout.write(f"largest batch that fits: not found ({e})\n")
            return code
        where = f"largest batch that fits {iec(fit.limit_bytes)}: {fit.batch_size}"
        peak = f" (predicted peak {iec(fit.peak_bytes)})" if fit.peak_bytes is not None else \
            " (even batch 1 does not fit)"
        sys.stdout.write(where + peak + f", from {len(fit.samples)} simulations\n")
    return code


def _profile(ns: argparse.Namespace) -> int:
    from .api import profile

    model, args, kwargs = _build(ns, ns.device or "cpu")   # real weights: hf: specs build on meta otherwise
    model.eval()
    rep = profile(model, *args, warmup=ns.warmup, repeats=ns.repeats, backward=ns.backward,
                  roofline=ns.roofline, progress=_live(ns), forward_kwargs=kwargs)
    if ns.trace:
        rep.to_chrome_trace(ns.trace)
    return _emit(ns, rep)


def _onnx_tile(ns: argparse.Namespace) -> int:
    from .api import onnx_tile
    from .errors import InputError

    if len(ns.block) != 3:
        raise InputError(f"--block needs three sizes M,K,N, got {ns.block}")
    with _status(f"tiling {ns.file}", ns):
        res = onnx_tile(ns.file, block=tuple(ns.block), ops=tuple(ns.ops.split(",")),
                        nodes=ns.nodes.split(",") if ns.nodes else None, input_shapes=_input_shapes(ns),
                        verify=ns.verify)
    res.save(ns.out)
    lines = [f"tiled {len(res.tiled)} node(s) into {res.blocks} blocks of at most "
             f"{'x'.join(str(b) for b in ns.block)}: {ns.out}"]
    lines += [f"skipped {name}: {why}" for name, why in res.skipped]
    if res.verified:
        v = res.verified
        lines.append(f"onnxruntime, {v['runs']} random inputs: max abs error {v['max_abs_error']:.3g}, "
                     f"MSE {v['mse']:.3g}")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _input_shapes(ns: argparse.Namespace) -> dict | None:
    """--input NAME=DIMS items: an input's shape, or a symbolic dim's value."""
    from .errors import InputError

    shapes: dict = {}
    inputs: set[str] | None = None       # the graph's input names, read once when a single value needs them
    for item in ns.input or []:
        name, sep, dims = item.partition("=")
        try:
            vals = [int(d) for d in dims.split(",")] if sep else None
        except ValueError:
            vals = None
        if not vals or not name:
            raise InputError(f"--input {item!r}: expected NAME=DIMS such as x=1,3,224,224 or batch=8")
        if len(vals) == 1 and inputs is None:
            from .formats.onnx import load_onnx
            inputs = {i.name for i in load_onnx(ns.file).graph.input}
        # one value for a name that is not a graph input: a symbolic dim's value
        shapes[name] = vals[0] if len(vals) == 1 and name not in inputs else tuple(vals)
    return shapes or None


def _onnx(ns: argparse.Namespace) -> int:
    from .api import analyze_onnx

    with _status(f"analysing {ns.file}", ns):
        rep = analyze_onnx(ns.file, _input_shapes(ns))
    if ns.format == "json":
        return _write(ns, rep.to_json())
    if ns.format == "csv":
        return _write(ns, rep.graph.to_csv(ns.sort, ns.top))
    if ns.format == "html":
        return _write(ns, rep.to_html())
    return _write(ns, rep.table(depth=ns.depth, fold=not ns.expand) + "\n" + rep.graph.table(ns.sort, ns.top))


def _load_json(path: str) -> dict:
    """A saved report (``--format json``): its dict, with ``kind`` (reports saved before the field
    existed are summaries)."""
    import json

    from .errors import InputError
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror}") from e
    except ValueError as e:
        raise InputError(f"{path} is not JSON: {e}") from e
    if not isinstance(data, dict) or "schema_version" not in data:
        raise InputError(f"{path} is not a layerscope report (no schema_version)")
    data.setdefault("kind", "summary")
    return data


_PART = {"summary": "summary", "memory": "memory", "latency": "latency", "stage_plan": "plan"}


def _report(ns: argparse.Namespace) -> int:
    from .errors import InputError
    from .render.html import html_page

    if all(s.endswith(".json") for s in ns.spec):
        parts: dict = {}
        for path in ns.spec:
            data = _load_json(path)
            part = _PART.get(data["kind"])
            if part is None or part in parts:
                raise InputError(f"{path}: a {data['kind']} report "
                                 + ("is already on the page" if part else "cannot go on the page"))
            parts[part] = data
        return _write(ns, html_page(ns.title, **parts))
    if len(ns.spec) > 1:
        raise InputError("report takes one model spec, or saved JSON reports (*.json)")
    from .api import analyze, memory, partition, profile
    from .options import optimizer_factory
    ns.spec = ns.spec[0]
    device = "cpu" if ns.profile and not ns.device else ns.device   # timing needs real weights
    model, args, kwargs = _build(ns, device)
    with _status("analysing", ns):
        summary = analyze(model, *args, device=device, backward=ns.training, forward_kwargs=kwargs)
    mem = lat = plan = None
    if ns.memory:
        model.train(ns.training)           # a training step with dropout on; inference without
        with _status("simulating the step", ns):
            mem = memory(model, *args, optimizer=optimizer_factory(ns.optimizer) if ns.training else None,
                         training=ns.training, autocast_dtype=ns.autocast, batch_size=ns.batch_size,
                         steps=ns.steps, accumulation=ns.accumulation, device=device, forward_kwargs=kwargs)
    model.eval()                           # timed and split as `profile` and `split` run it
    if ns.profile:
        lat = profile(model, *args, repeats=ns.repeats, backward=ns.training, progress=_live(ns),
                      forward_kwargs=kwargs)
    if ns.stages:
        with _status("planning", ns):
            plan = partition(model, *args, stages=ns.stages, by=ns.by, optimizer=ns.optimizer, device=device,
                             **kwargs)
    return _write(ns, summary.to_html(memory=mem, latency=lat, plan=plan, title=ns.title))


def _sides(ns: argparse.Namespace, spec: str) -> list[dict]:
    """One side of a comparison: a saved report's dict, or a fresh analysis of a model spec (with
    its training-step memory for --memory, its per-layer times for --profile)."""
    if spec.endswith(".json"):
        return [_load_json(spec)]
    from .api import analyze, memory, profile
    ns.spec = spec
    device = "cpu" if ns.profile and not ns.device else ns.device       # timing needs real weights
    model, args, kwargs = _build(ns, device)
    with _status(f"analysing {spec}", ns):
        out = [analyze(model, *args, device=device, forward_kwargs=kwargs).to_dict()]
        if ns.memory:
            out.append(memory(model, *args, optimizer="adamw", device=device,
                              forward_kwargs=kwargs).to_dict(timeline=False))
    if ns.profile:
        model.eval()
        out.append(profile(model, *args, progress=_live(ns), forward_kwargs=kwargs).to_dict())
    return out


def _compare(ns: argparse.Namespace) -> int:
    import json

    from .render.views import compare
    from .errors import InputError
    a, b = _sides(ns, ns.a), _sides(ns, ns.b)
    if len(a) != len(b):
        raise InputError("compare two saved reports, or two model specs (--memory and --profile apply to specs)")
    diffs = [compare(x, y, names=(ns.a, ns.b)) for x, y in zip(a, b)]
    if ns.format == "json":
        return _write(ns, json.dumps([d.to_dict() for d in diffs] if len(diffs) > 1 else diffs[0].to_dict(),
                                     indent=2))
    if ns.format == "csv":
        from .render.csv import csv_text
        rows = [{"compared": d.compared, **r} for d in diffs for r in d.rows()]
        return _write(ns, csv_text(list(dict.fromkeys(k for r in rows for k in r)), rows))
    view = {"depth": ns.depth, "changed": ns.changed, "fold": not ns.expand}
    if ns.output is None and sys.stdout.isatty():       # fitted to the terminal
        for d in diffs:
            d.print(**view)
        return 0
    return _write(ns, "\n".join(d.table(**view) for d in diffs))


def _list_presets(ns: argparse.Namespace) -> int:
    import json

    from .render.csv import csv_text
    from .render.text import text_table
    from .render.units import si
    from .specs import presets

    rows = [{"name": f"hf:{k}", "model": v["model"], "params": v["params"], "default_inputs":
             ", ".join(f"{n}={'x'.join(map(str, s))}" for n, s in v["inputs"].items()),
             "description": v["description"]} for k, v in presets().items()]
    if ns.format == "json":
        return _write(ns, json.dumps(rows, indent=2))
    if ns.format == "csv":
        return _write(ns, csv_text(list(rows[0]), rows))
    body = [[r["name"], r["model"], si(r["params"]), r["default_inputs"], r["description"]] for r in rows]
    footer = [("Presets", f"{len(rows)}, built on meta by default (nothing allocated); --set changes any "
                          "config field, --input-ids the sequence")]
    return _write(ns, text_table(["Spec", "Model", "Params", "Default inputs", "Description"], body, footer))


def main(argv: Sequence[str] | None = None) -> int:
    try:
        ns = _parser().parse_args(argv)
    except SystemExit as e:          # --help and --version exit 0; a usage error prints one line
        if e.code in (0, None):
            raise
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    commands = {"summary": _summary, "memory": _memory, "split": _split, "profile": _profile, "onnx": _onnx,
                "onnx-tile": _onnx_tile, "report": _report, "compare": _compare, "list-presets": _list_presets}
    try:
        if ns.command in commands:
            return commands[ns.command](ns)
    except LayerscopeError as e:
        print(f"layerscope: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("layerscope: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # never a traceback for the user; the message says what broke
        print(f"layerscope: internal error: {type(e).__name__}: {e} (please report this)", file=sys.stderr)
        return EXIT_INTERNAL
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
