"""Command-line flags derived from the options' own field declarations (options.opt): a flag's name,
type, choices, default and help come from its field, and a command's options object is built from
the flags given. Adding an option to a command is adding its field."""

from __future__ import annotations

import argparse
import dataclasses
import typing
from typing import Any

from .argtypes import arg_bandwidth, arg_count, arg_count_or_auto, arg_device, arg_gpu, arg_ints

# the converters a field names by ``arg`` (options.py sits below the CLI: it names them, this maps them)
_ARGS = {"gpu": arg_gpu, "bandwidth": arg_bandwidth, "device": arg_device, "ints": arg_ints, "float": float}


def flag_name(field: dataclasses.Field) -> str:
    """The field's flag: its declared one, or ``--`` and its name with dashes (``--no-NAME`` for a
    switch that is on by default)."""
    declared = field.metadata.get("flag")
    if isinstance(declared, str):
        return declared
    name = field.name.replace("_", "-")
    return f"--no-{name}" if field.default is True and field.metadata.get("action") != "optional" else f"--{name}"


def _choices(field: dataclasses.Field, hint) -> tuple | None:
    if "choices" in field.metadata:
        return tuple(field.metadata["choices"])
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    return None


def add_flags(parser: argparse.ArgumentParser, cls, *names: str, gpus: str = "", defaults: dict | None = None) -> None:
    """The flags of the options class ``cls``'s fields ``names`` (none: every flag field of ``cls``
    the parser does not have yet, in declaration order: a command lays out its help by the few it
    places first). ``gpus``: the GPU table's names, for a help that lists them. ``defaults``: a
    command's own default for a flag (its help then says it: `report` trains with adamw)."""
    hints = typing.get_type_hints(cls)
    by_name = {f.name: f for f in _flag_fields(cls)}
    chosen = [by_name[n] for n in names] if names else \
        [f for f in by_name.values() if flag_name(f) not in parser._option_string_actions]
    for f in chosen:
        m = f.metadata
        kw: dict[str, Any] = {"dest": f.name}
        help_text = m.get("help")
        kw["help"] = argparse.SUPPRESS if m.get("hidden") else (help_text.replace("{gpus}", gpus)
                                                                if help_text else None)
        default = m.get("cli_default", None if f.default is dataclasses.MISSING else f.default)
        if defaults and f.name in defaults:
            default = defaults[f.name]
            kw["help"] += f" (default {default})"
        if hints[f.name] is bool or isinstance(f.default, bool):
            # a switch: it turns the default over; not given, the field's default applies (None: "not held")
            if m.get("action") == "optional":        # --NAME and --no-NAME
                kw.update(action=argparse.BooleanOptionalAction)
            elif f.default is True:
                kw.update(action="store_const", const=False)
            else:
                kw.update(action="store_true")
            if "cli_default" in m:
                kw["default"] = m["cli_default"]
            parser.add_argument(flag_name(f), **kw)
            continue
        if f.default is dataclasses.MISSING or m.get("required"):
            kw["required"] = True
        else:
            kw["default"] = default
        if m.get("arg") == "count_or_auto":
            kw["type"] = arg_count_or_auto(m["least"])
        elif "least" in m:
            kw["type"] = arg_count(m["least"])
        elif "arg" in m:
            kw["type"] = _ARGS[m["arg"]]
        choices = _choices(f, hints[f.name])
        if choices is not None:
            kw["choices"] = choices
        for key in ("metavar", "action"):
            if key in m:
                kw[key] = m[key]
        parser.add_argument(flag_name(f), **kw)


def _flag_fields(cls) -> list:
    from ..options import flag_fields
    return flag_fields(cls)


def given(ns: argparse.Namespace, cls, *, searched: bool | None = None) -> dict:
    """``{field: value}`` of the flags of ``cls`` given on the command line (a flag at None was not:
    the field's default applies). ``searched``: only the search's dimensions (True) or only the
    others (False)."""
    out = {}
    for f in _flag_fields(cls):
        if searched is not None and bool(f.metadata.get("searched")) != searched:
            continue
        value = getattr(ns, f.name, None)
        if value is not None:
            out[f.name] = value
    return out


def searched(cls) -> tuple[str, ...]:
    """The fields of ``cls`` a search varies unless they are given (``opt(searched=True)``)."""
    return tuple(f.name for f in _flag_fields(cls) if f.metadata.get("searched"))
