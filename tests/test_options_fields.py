"""Issue 59, item 3: each option is one field declaration (options.opt: type, default, help, flag,
validation), from which the CLI's flags, the Python keywords and the report's echo of the options are
derived. Adding an option is one field: a subclass that declares one more shows it arriving in all three."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import pytest
import torch
from torch import nn

import layerscope
from layerscope.cli.flags import add_flags, given, searched
from layerscope.cli.parser import build_parser
from layerscope.errors import InputError
from layerscope.options import ParallelOptions, echo, entry_options, flag_fields, opt
from layerscope.planning.config import ParallelConfig


@dataclass(frozen=True, slots=True)
class WithWindow(ParallelOptions):
    """parallel()'s options and one more, declared once."""

    window: int = opt(3, least=1, echo=True, help="a new option's help (default 3)")


def test_one_field_is_a_flag_a_keyword_and_echoed():
    # the CLI: a flag named after the field, its type (at least 1), default and help from the declaration
    p = argparse.ArgumentParser(prog="t")
    add_flags(p, WithWindow)
    assert "--window" in p._option_string_actions
    assert "a new option's help (default 3)" in p.format_help()
    ns = p.parse_args(["--window", "5"])
    assert given(ns, WithWindow) == {"window": 5, "device": "cuda", "optimizer": "adamw", "loss": "auto",
                                     "search": False}
    with pytest.raises(SystemExit):
        p.parse_args(["--window", "0"])
    # the keyword: taken out of the entry point's keywords, the rest stays the forward's
    ids = torch.zeros(1, 4, dtype=torch.long)
    opts, forward = entry_options(WithWindow, None, {"window": 7, "input_ids": ids})
    assert opts.window == 7 and set(forward) == {"input_ids"}
    # one source for each option: as a keyword and in options= is refused
    with pytest.raises(InputError, match="window given both"):
        entry_options(WithWindow, WithWindow(), {"window": 7})
    # the echo: after parallel()'s own, in declaration order
    assert list(echo(opts)) == ["device", "backend", "gpu", "optimizer", "steps", "window"]
    assert echo(opts)["window"] == 7 and echo(opts)["optimizer"] == "AdamW"


def test_the_parallel_command_takes_every_declared_flag():
    """`layerscope parallel`'s flags are the fields' (nothing mapped by hand), and a search dimension's
    flag defaults to None (not held) while the others default to the field's value."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    pl = sub.choices["parallel"]
    dests = {a.dest: a for a in pl._actions}
    for cls in (ParallelConfig, ParallelOptions):
        for f in flag_fields(cls):
            assert f.name in dests, f.name
    for f in dataclasses.fields(ParallelConfig):
        if f.name in dests and f.name != "model_dtype" and f.default is not dataclasses.MISSING:
            assert dests[f.name].default == (None if f.name in searched(ParallelConfig) else f.default), f.name
    # cp and ep (issue 60): searched since the search's space covers them (planning/search/candidates.py)
    assert set(searched(ParallelConfig)) == {"fsdp", "replicate", "tp", "pp", "schedule", "microbatches",
                                             "accumulation", "global_batch", "ac", "reshard_after_forward",
                                             "cp", "ep"}


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])   # the blocks FSDP2 wraps

    def forward(self, x):
        for b in self.layers:
            x = torch.relu(b(x))
        return x


def _mlp():
    torch.manual_seed(0)
    return _Net(), torch.randn(4, 16)


def test_parallel_takes_its_options_as_one_object():
    m, x = _mlp()
    by_keywords = layerscope.parallel(m, x, gpus=2, device="cpu", steps=1, loss="sum")
    by_object = layerscope.parallel(m, x, gpus=2, options=layerscope.ParallelOptions(device="cpu", steps=1, loss="sum"))
    assert by_object.plan.peak_bytes == by_keywords.plan.peak_bytes
    assert by_object.options == by_keywords.options
    assert by_object.options == {"device": "cpu", "backend": "gloo", "gpu": None, "optimizer": "AdamW", "steps": 1,
                                 "allocation_block": 1}
    with pytest.raises(InputError, match="steps given both"):
        layerscope.parallel(m, x, gpus=2, steps=2, options=layerscope.ParallelOptions(device="cpu"))
    with pytest.raises(InputError, match="search_limit is a count"):
        layerscope.ParallelOptions(search_limit=0)


@pytest.mark.parametrize("command, classes", [
    ("parallel", ("ParallelConfig", "ParallelOptions")), ("split", ("PartitionOptions",)),
    ("memory", ("MemoryOptions",)), ("summary", ("AnalyzeOptions",)), ("profile", ("ProfileOptions",))])
def test_each_command_takes_its_options_flags(command, classes):
    """Every flag field of a command's options classes is one of its flags, with the field's type
    (a Literal's choices) and default: nothing declared twice."""
    import layerscope.options as options
    import layerscope.planning.config as config
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    dests = {a.dest: a for a in sub.choices[command]._actions}
    for name in classes:
        cls = getattr(options, name, None) or getattr(config, name)
        for f in flag_fields(cls):
            assert f.name in dests, (command, f.name)
            want = f.metadata.get("choices")
            if want is not None:
                assert tuple(dests[f.name].choices) == tuple(want), (command, f.name)


def test_parallel_options_hold_the_configuration_once():
    m, x = _mlp()
    opts = layerscope.ParallelOptions(device="cpu", config=ParallelConfig(gpus=2))
    with pytest.raises(InputError, match="either as config= or as keywords"):
        layerscope.parallel(m, x, gpus=2, options=opts)
    with pytest.raises(InputError, match="config given both"):
        layerscope.parallel(m, x, config=ParallelConfig(gpus=2), options=opts)
    with pytest.raises(InputError, match="not config="):
        layerscope.parallel(m, x, options=dataclasses.replace(opts, search=True))
