"""Issue 58, item 8: the sharded CLI tried cold. A micro-batch count that does not divide the local batch
names the ones that do, and --run --steps 2 names the flag, both before the model is built; a TP x PP
note names the model's own module path and says in plain words what nonzero without values means; a
rank alone is "rank 1", not "ranks 1"; the JSON lists each rank's pipeline stages; a shrunk GPT-2's
vocabulary does not make transformers warn about bos/eos ids layerscope's analysis never uses."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading

import pytest
import torch

import layerscope
from layerscope.cli import main

pytest.importorskip("transformers")

GPT2 = ["hf:gpt2", "--set", "n_layer=2", "--set", "n_embd=64", "--set", "n_head=4", "--set", "vocab_size=128"]


def _no_build(monkeypatch):
    import layerscope.cli.parallel as cli_parallel

    def build(*a, **k):
        raise AssertionError("the model was built before the options were checked")
    monkeypatch.setattr(cli_parallel, "build_spec", build)


def test_microbatches_that_do_not_divide_name_the_ones_that_do(capsys, monkeypatch):
    _no_build(monkeypatch)
    code = main(["parallel", *GPT2, "--input-ids", "4,16", "--gpus", "2", "--pp", "2", "--microbatches", "3",
                 "--device", "cpu"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1, err
    assert "microbatches (--microbatches) 3 does not divide the local batch 4: use 1, 2 or 4" in err


def test_run_with_too_few_steps_names_the_flag_before_building(capsys, monkeypatch):
    _no_build(monkeypatch)
    code = main(["parallel", *GPT2, "--input-ids", "2,16", "--gpus", "2", "--device", "cpu", "--run", "--steps", "2"])
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1, err
    assert "--run needs --steps of at least 3" in err and "got --steps 2" in err


@pytest.fixture(scope="module")
def tp_pp():
    """A Llama of 4 layers on 4 CPU ranks: tp 2 x pp 2, interleaved (2 stages a rank)."""
    from layerscope.specs import build_model
    over = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128)
    m = build_model("hf:LlamaConfig", "meta", over, "causal-lm").model
    return layerscope.parallel(m, torch.zeros(2, 16, dtype=torch.long, device="meta"), gpus=4, tp=2, pp=2, fsdp=1,
                               schedule="interleaved", device="cpu", steps=1)


def test_tp_pp_notes_name_the_models_paths(tp_pp):
    """Tensor parallel's embedding zeroes the token ids of other ranks' vocabulary shards with a boolean
    mask (a nonzero inside); the note named it "0.model.model.embed_tokens" (the rank's list of stage
    wrappers, then the wrapper's model) and said only "had no values for nonzero"."""
    (note,) = [n for n in tp_pp.notes if "nonzero" in n]
    assert "in model.embed_tokens (x" in note and "model.model." not in note and "0.model" not in note
    assert "every element was taken as nonzero" in note and "without values" in note


def test_json_lists_each_ranks_stages(tp_pp):
    # interleaved, 4 stages on 2 pipeline ranks: stage s on pp coordinate s % 2; global rank r is at pp
    # coordinate r // 2 (tp 2 within it): ranks 0, 1 hold stages 0 and 2, ranks 2, 3 stages 1 and 3
    d = json.loads(tp_pp.to_json())
    assert d["schema"] == 6
    assert [r["stages"] for r in d["plans"][0]["ranks"]] == [[0, 2], [0, 2], [1, 3], [1, 3]]


def test_a_rank_alone_is_one_rank(tp_pp):
    """The measured peaks by role: rank 1 made a role of its own here (its peak moved by a byte)."""
    ranks = list(tp_pp.plan.ranks)
    ranks[1] = dataclasses.replace(ranks[1], peak_bytes=ranks[1].peak_bytes + 1)
    measured = {"ranks": [{"peak_bytes": r.peak_bytes} for r in ranks], "loss_equal": True,
                "max_rel_loss_diff": 0.0, "step_time": 0.1}
    rep = layerscope.render.views.ParallelReport(model_name="m", options=tp_pp.options, notes=(),
                                                  plans=(dataclasses.replace(tp_pp.plan, ranks=tuple(ranks),
                                                                             measured=measured),))
    text = " ".join(str(rep).split())
    assert "Measured, rank 0 " in text and "Measured, rank 1 " in text and "Measured, ranks 2-3 " in text
    assert "ranks 1 " not in text and "ranks 0 " not in text


class _Records(logging.Handler):
    def __init__(self):
        super().__init__()
        self.got = []

    def emit(self, record):
        self.got.append(record.getMessage())


def test_shrunk_gpt2_does_not_warn_about_its_token_ids():
    """gpt2's bos/eos ids (50256) are outside a vocabulary of 131: transformers warned twice, once per
    message and process (warning_once, whose cache is emptied here so the test sees its first time). The
    ids the user sets are still checked, and another thread's warnings pass while layerscope builds."""
    from transformers.utils import logging as hf_logging

    from layerscope._transformers import quiet_token_ids
    from layerscope.specs import build_model
    log = logging.getLogger("transformers.configuration_utils")
    seen = _Records()
    log.addHandler(seen)
    try:
        hf_logging.get_logger("x").warning_once.cache_clear()
        small = dict(n_layer=1, n_embd=32, n_head=2, vocab_size=131)
        build_model("hf:gpt2", "meta", small)
        assert not [m for m in seen.got if "_token_id must be" in m], seen.got
        build_model("hf:gpt2", "meta", {**small, "bos_token_id": 500})
        assert [m for m in seen.got if "_token_id must be" in m] == [
            "Model config: bos_token_id must be `None` or an integer within the vocabulary (between 0 and 130), "
            "got 500. This may result in unexpected behavior."]
        seen.got.clear()
        msg = "Model config: eos_token_id must be `None` or an integer within the vocabulary (between 0 and 9), got 11."
        with quiet_token_ids(set()):
            other = threading.Thread(target=log.warning, args=(msg,))
            other.start()
            other.join()
            log.warning(msg)
        assert seen.got == [msg]            # the other thread's passed, this thread's was dropped
    finally:
        log.removeHandler(seen)
