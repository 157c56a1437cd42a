"""`layerscope ...` command line. The only place that prints or exits."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Sequence

import torch

from .errors import LayerscopeError

EXIT_USAGE, EXIT_ERROR, EXIT_INTERNAL = 2, 1, 3

_SPEC_HELP = """model spec, one of:
  path/to/file.py:factory   imports and RUNS that file (it is your code: only use files you trust),
                            then calls factory()
  package.module:factory    e.g. layerscope.examples:small_cnn
  hf:ConfigClass[:Model]    a transformers config with defaults (built on meta unless --device),
                            e.g. hf:GPT2Config, hf:BertConfig:BertForMaskedLM
  torchvision:name          e.g. torchvision:resnet50 (needs torchvision)
  timm:name                 e.g. timm:vit_base_patch16_224 (needs timm)"""


def _ints(text: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.replace("x", ",").split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers like 1,3,224,224, got {text!r}")
    if not vals or any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected non-negative integers like 1,3,224,224, got {text!r}")
    return vals


def _dtype(text: str) -> torch.dtype:
    dt = getattr(torch, text, None)
    if not isinstance(dt, torch.dtype):
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r} (e.g. float32, bfloat16, int64)")
    return dt


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="layerscope", description="What is inside a PyTorch model, layer by layer.")
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("summary", help="per-layer shapes, params, MACs, FLOPs, bytes",
                       formatter_class=argparse.RawTextHelpFormatter)
    s.add_argument("spec", help=_SPEC_HELP)
    s.add_argument("--input-size", type=_ints, action="append", metavar="1,3,224,224",
                   help="shape of an example input (repeat for several inputs)")
    s.add_argument("--input-ids", type=_ints, metavar="B,S", help="token ids of shape B,S (int64)")
    s.add_argument("--dtype", type=_dtype, action="append", help="dtype per --input-size (default float32)")
    s.add_argument("--device", help="cpu, cuda, or meta (count without computing)")
    s.add_argument("--depth", type=int, default=3, help="deepest layer level shown (default 3)")
    s.add_argument("--columns", help="comma-separated: input_shape,output_shape,params,params_percent,"
                                     "kernel,macs,flops,bytes_read,bytes_written,trainable,receptive_field,"
                                     "backward_macs,backward_flops")
    s.add_argument("--format", choices=("table", "json", "csv"), default="table")
    s.add_argument("--output", "-o", help="write to this file instead of standard output")
    s.add_argument("--set", action="append", metavar="KEY=VALUE", help="config/factory override (repeatable)")
    s.add_argument("--head", help="hf: model head: causal-lm, masked-lm, seq2seq-lm, seq-cls, token-cls, image-cls")
    s.add_argument("--mode", choices=("eval", "train", "same"), default="eval")
    s.add_argument("--backward", action="store_true", help="also run and count a backward pass")
    s.add_argument("--causal", choices=("dense", "unmasked"), default="dense",
                   help="count causal attention densely (default) or only its unmasked part")
    return p


def _status(text: str):
    """A spinner on stderr while work runs, only when stderr is a terminal."""
    if not sys.stderr.isatty():
        return contextlib.nullcontext()
    from rich.console import Console
    return Console(stderr=True).status(text)


def _summary(ns: argparse.Namespace) -> int:
    from .api import analyze
    from .capture import make_inputs, model_device
    from .errors import InputError
    from .specs import build_model, parse_overrides, token_ids

    with _status(f"building {ns.spec}"):
        built = build_model(ns.spec, ns.device, parse_overrides(ns.set), ns.head)
    model = built.model
    dev = torch.device(ns.device) if ns.device else model_device(model)
    args: tuple = ()
    kwargs: dict = {}
    if ns.input_size:
        dtypes = ns.dtype or None
        if dtypes is not None and len(dtypes) == 1 and len(ns.input_size) > 1:
            dtypes = dtypes * len(ns.input_size)
        args = tuple(make_inputs(ns.input_size, dtypes, None, dev))
    elif ns.dtype:
        raise InputError("--dtype applies to --input-size inputs")
    if ns.input_ids:
        if len(ns.input_ids) != 2:
            raise InputError("--input-ids takes B,S")
        vocab = getattr(getattr(model, "config", None), "vocab_size", None) or 2
        ids = token_ids(ns.input_ids, vocab, dev)
        if hasattr(model, "config"):
            kwargs["input_ids"] = ids
        else:
            args = args + (ids,)
    if not args and not kwargs:
        if built.default_inputs is None:
            raise InputError(f"no inputs for {ns.spec}: give --input-size (or --input-ids)")
        args, kwargs = built.default_inputs(dev)
    with _status("analysing"):
        rep = analyze(model, *args, device=ns.device, mode=ns.mode, backward=ns.backward,
                      causal=ns.causal, **kwargs)
    if ns.format == "json":
        text = rep.to_json()
    elif ns.format == "csv":
        text = rep.to_csv()
    else:
        if ns.output is None:
            rep.print(depth=ns.depth, columns=ns.columns)
            return 0
        text = rep.table(depth=ns.depth, columns=ns.columns)
    if ns.output:
        try:
            with open(ns.output, "w", encoding="utf-8") as f:
                f.write(text)
        except OSError as e:
            raise InputError(f"cannot write {ns.output}: {e.strerror}") from e
    else:
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    ns = _parser().parse_args(argv)
    try:
        if ns.command == "summary":
            return _summary(ns)
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
