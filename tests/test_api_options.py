"""Options are objects the entry points build once and pass down (issue 32, step 3): the few common
options are named keywords, every other option of the entry point is still taken as a keyword, all of
them fit in ``options=``, and one given both ways is one clear InputError."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.options import entry_options

ENTRY_POINTS = {
    ls.analyze: ls.AnalyzeOptions, ls.activations: ls.AnalyzeOptions, ls.memory: ls.MemoryOptions,
    ls.max_batch_size: ls.MemoryOptions, ls.profile: ls.ProfileOptions, ls.analyze_exported: ls.AnalyzeOptions,
    ls.analyze_torchscript: ls.AnalyzeOptions, ls.analyze_onnx: ls.OnnxOptions, ls.onnx_tile: ls.TileOptions,
}


@pytest.mark.parametrize("fn", ENTRY_POINTS, ids=lambda f: f.__name__)
def test_signature_pattern(fn):
    params = inspect.signature(fn).parameters
    assert len(params) <= 12                      # *args and **kwargs counted
    assert "options" in params and params["options"].default is None
    # every option the signature names is a field of the options object
    fields = {f.name for f in dataclasses.fields(ENTRY_POINTS[fn])}
    named = {n for n, p in params.items() if p.kind is p.KEYWORD_ONLY and n not in ("options", "forward_kwargs")}
    assert named - {"select", "limit", "max_batch"} <= fields


class Takes(nn.Module):
    """A forward with a keyword input named like nothing the options know, and one named `causal`."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, scale=1.0, causal=False):
        return self.lin(x) * scale * (2 if causal else 1)


def test_analyze_options_object_equals_keywords():
    m, x = Takes(), torch.randn(2, 4)
    by_kw = ls.analyze(m, x, mode="train", backward=True, causal="unmasked", scale=2.0)
    by_obj = ls.analyze(m, x, options=ls.AnalyzeOptions(mode="train", backward=True, causal="unmasked"), scale=2.0)
    assert by_kw.to_dict() == by_obj.to_dict()


def test_an_option_given_both_ways_is_one_clear_error():
    m, x = Takes(), torch.randn(2, 4)
    with pytest.raises(ls.InputError, match=r"^mode given both as a keyword and in options=$"):
        ls.analyze(m, x, mode="train", options=ls.AnalyzeOptions())
    with pytest.raises(ls.InputError, match=r"^causal given both"):     # a keyword taken out of **kwargs
        ls.analyze(m, x, causal="unmasked", options=ls.AnalyzeOptions())
    with pytest.raises(ls.InputError, match=r"^steps given both"):
        ls.memory(m, x, steps=1, options=ls.MemoryOptions())
    with pytest.raises(ls.InputError, match=r"^options must be a layerscope.MemoryOptions"):
        ls.memory(m, x, options=ls.AnalyzeOptions())


def test_a_named_keyword_at_its_default_leaves_the_options_object_alone():
    m, x = Takes(), torch.randn(2, 4)
    rep = ls.analyze(m, x, mode="eval", options=ls.AnalyzeOptions(mode="train"))
    assert rep.to_dict() == ls.analyze(m, x, mode="train").to_dict()


def test_forward_argument_named_like_an_option_goes_through_forward_kwargs():
    m, x = Takes(), torch.randn(2, 4)
    plain = ls.analyze(m, x)
    # `causal` as a keyword is analyze's option; the forward's `causal` goes in forward_kwargs
    assert ls.analyze(m, x, causal="dense").to_dict() == plain.to_dict()
    opts, fwd = entry_options(ls.AnalyzeOptions, None, {"scale": 3.0}, {"causal": True})
    assert opts == ls.AnalyzeOptions() and fwd == {"scale": 3.0, "causal": True}
    ls.analyze(m, x, forward_kwargs={"causal": True})


def test_memory_rare_options_as_keywords_or_in_the_object():
    m, x = Takes(), torch.randn(2, 4)
    a = ls.memory(m, x, optimizer="sgd", steps=1, accumulation=2)
    b = ls.memory(m, x, options=ls.MemoryOptions(optimizer="sgd", steps=1, accumulation=2))
    assert a.to_dict(timeline=False) == b.to_dict(timeline=False)
    fit = ls.max_batch_size(m, x, limit="1MiB", max_batch=4, options=ls.MemoryOptions(steps=1))
    assert fit.batch_size == ls.max_batch_size(m, x, limit="1MiB", max_batch=4, steps=1).batch_size


def test_activations_take_only_the_mode_from_options():
    m, x = Takes(), torch.randn(2, 4)
    assert set(ls.activations(m, x, options=ls.AnalyzeOptions(mode="train"))) == set(ls.activations(m, x))
    with pytest.raises(ls.InputError, match="only mode"):
        ls.activations(m, x, options=ls.AnalyzeOptions(backward=True))
