"""Converters of option values: a bad value is a one-line usage error, before anything runs."""

from __future__ import annotations

import argparse

import torch


def arg_ints(text: str) -> tuple[int, ...]:
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


def arg_count(least: int):
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


def arg_count_or_auto(least: int):
    """--repeats/--warmup: ``auto`` (profile() chooses from the measured spread) or an integer of
    at least ``least``."""
    count = arg_count(least)

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


def arg_device(text: str) -> str:
    try:
        torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown device {text!r} (cpu, cuda, cuda:1, meta)")
    return text


def arg_dtype(text: str) -> torch.dtype:
    dt = getattr(torch, text, None)
    if not isinstance(dt, torch.dtype):
        raise argparse.ArgumentTypeError(f"unknown dtype {text!r} (e.g. float32, bfloat16, int64)")
    return dt


def arg_bandwidth(text: str) -> float:
    """'50e9', '50GB/s', '2.5TB/s' -> bytes per second (parsed in options, as a usage error here)."""
    from ..options import parse_bandwidth
    try:
        return parse_bandwidth(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def arg_gpu(text: str):
    """--gpu NAME[,FIELD=VALUE...]: a row of the built-in GPU table with any figure replaced, e.g.
    ``H100,capability=8.0,memory=40GiB,bandwidth=2TB/s,bfloat16=700e12,network=25GB/s``."""
    from ..costs.gpus import gpu
    from ..errors import InputError
    from ..options import parse_bandwidth, parse_bytes
    name, *fields = [p.strip() for p in text.split(",")]
    if not name:
        raise argparse.ArgumentTypeError("expected a GPU name such as H100 (then optional ,FIELD=VALUE)")
    overrides = {}
    for field in fields:
        key, sep, value = field.partition("=")
        try:
            if not sep:
                raise ValueError(f"expected FIELD=VALUE after the GPU's name, got {field!r}")
            if key == "capability":
                major, _, minor = value.partition(".")
                if not (major.isdigit() and (minor or "0").isdigit()):
                    raise ValueError(f"capability must be MAJOR.MINOR such as 8.0, got {value!r}")
                overrides[key] = (int(major), int(minor or 0))
            elif key == "memory":
                overrides[key] = parse_bytes(value)
            elif key in ("bandwidth", "nvlink", "network"):
                overrides[key] = parse_bandwidth(value)
            else:
                overrides[key] = float(value)
        except (ValueError, InputError) as e:
            msg = str(e) if not isinstance(e, ValueError) or "FIELD" in str(e) or key == "capability" else \
                f"{key}: expected a positive number, got {value!r}"
            raise argparse.ArgumentTypeError(msg) from None
    try:
        return gpu(name, **overrides)
    except InputError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
