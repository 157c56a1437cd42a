"""Notes are records (issue 59 items 1 and 4): producers return ``capture.notes.Note`` (a code and its
data), and reports/notes.py words every code in one table. Every code a producer can return has a
wording, wording a note never changes its data, and a report reads its records as sentences."""

from __future__ import annotations

import copy
import pickle
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.capture.notes import Note
from layerscope.reports.notes import WORDING, word, worded

SRC = Path(ls.__file__).parent
_PLACES = (("model.0", 2), ("model.1", 1))

# one example of each code's data (what its producer records)
EXAMPLES = {
    **{f"simulation-{k}": {"kind": k, "what": ("a tensor's value", "read as 1") if k == "meta" else "torch.rand",
                           "times": 3, "places": _PLACES, "remedy": None}
       for k in ("random", "read", "nonzero", "meta", "size")},
    "loss-chosen": {"used": ("cross-entropy", "sum"), "kind": "cross-entropy", "asked": "auto", "labels": False,
                    "fallback": True, "ids": True},
    "loss-given": {"doc": "My loss"},
    "known-assumed-spread": {"count": 2},
    "known-cast-ones": {"count": 1},
    "known-index-bounds": {"ops": (("aten.gather", 3), ("aten.index", 1))},
    "attention-kernel": {"calls": 4, "per_forward": True, "kernel": "FlashAttention-2", "forced": False,
                         "rules": "torch 2.5", "gpu": "H100", "capability": (9, 0), "example": "q [2, 4, 8, 16]",
                         "passed_over": None},
    "attention-math-on-meta": {"calls": 1},
    "memory-meta-as-cpu": {},
    "memory-no-cuda": {},
    "memory-cuda-workspaces": {},
    "memory-untracked": {"count": 2},
    "world-one-role": {"world": 8},
    "world-roles": {"roles": (0, 4), "pp": 2},
    "world-no-gpu-named": {"gpu": "H100"},
    "world-cuda-allocator": {},
    "world-offload": {"cuda": True, "host_bytes": 1024},
    "world-gloo-late": {"bytes": 2048},
    "world-tp-plan": {"plan": "derived from Qwen3Config.base_model_tp_plan"},
    "world-context-parallel": {"cp": 2, "seq": 4096, "calls": 2},
    "world-uncounted-ops": {"ops": 3, "launch_us": 5.0},
    "world-one-device": {"ac": "none", "bf16": True},
    "world-composed": {"rank": 0, "blocks": 80, "ran": 5},
    "world-composed-refused": {"rank": 0, "why": "the blocks are parallelized differently at some places"},
    "search-searched": {"candidates": 12, "gpus": 8, "global_batch": 64, "seconds": 3.2, "simulated": 5,
                        "blocks": (1, 2), "for_bounds": 2, "passes": 40, "max_passes": None,
                        "counts": (("fits", 3), ("oom", 2))},
    "search-composed": {"composed": 12, "copies": 3, "whole": 0},
    "search-none-fits": {},
    "search-chosen": {"label": "fsdp 8", "gpus": 8, "command": "--fsdp 8"},
    "batch-not-checked": {"why": "the real step would need 80 GiB"},
    "batch-not-run": {"why": "the real step at batch 64 would need 80 GiB", "more": 2},
    "split-stage-share": {"schedule": "interleaved-1f1b", "stages_per_rank": 2},
    "split-zero-bubble": {"measured": False},
    "split-descent": {},
    "split-sends-unpriced": {},
    "split-optimizer-unpriced": {},
    "profiler-warmup-included": {"recorded": 1, "skip": 1},
    "profiler-counting-in-forward": {},
    "profiler-no-costs": {"error": "forward failed"},
    "partition-from-report": {},
    "partition-working-measured": {"device": "cpu"},
    "partition-weight-shares": {},
    "partition-roofline": {"name": "H100", "peak_flops": 989e12, "peak_bandwidth": 3.35e12, "source": "table"},
    "ep-routing": {"ep": 2, "routing": "skew:2", "skew": 2.0},
    "ep-routing-unused": {"routing": "skew:2"},
}


def _codes_in_source() -> set[str]:
    """Every code a producer in src/ names: ``Note("code", ...)`` and the simulation log's kinds."""
    codes = set()
    for path in SRC.rglob("*.py"):
        text = path.read_text()
        codes |= set(re.findall(r'Note\(\s*"([a-z][a-z0-9-]*)",', text))
        if path.name == "simulation.py":
            codes |= {f"simulation-{k}" for k in re.findall(r'log\.add\(\s*"([a-z]+)"', text)}
    return codes


def test_every_code_produced_has_a_wording():
    produced = _codes_in_source()
    assert produced, "no Note codes found in src/"
    assert produced <= set(WORDING), sorted(produced - set(WORDING))
    assert set(EXAMPLES) == set(WORDING)


@pytest.mark.parametrize("code", sorted(WORDING))
def test_wording_a_note_never_changes_its_data(code):
    note = Note(code, EXAMPLES[code])
    before = copy.deepcopy(dict(note.data))
    text = word(note)
    assert isinstance(text, str) and text
    assert dict(note.data) == before and word(note) == text
    with pytest.raises(TypeError):
        note.data["x"] = 1           # read-only: a wording cannot write to it
    assert pickle.loads(pickle.dumps(note)) == note


def test_strings_pass_through_and_a_report_reads_its_records_as_sentences():
    assert worded(["as it was", Note("memory-untracked", {"count": 2})]) == (
        "as it was", "2 tensors without a plain storage (sparse, nested) were not tracked")
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    rep = ls.memory(model, torch.randn(4, 8), device="cuda" if not torch.cuda.is_available() else "meta")
    assert rep.note_records and all(n.code in WORDING for n in rep.note_records)
    assert rep.notes == worded(rep.note_records)
    assert all(isinstance(n, str) for n in rep.to_dict()["notes"])
