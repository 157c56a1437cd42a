"""--loss (issue 58 item 0): the step's loss from the option's one declaration, said in the notes."""

from __future__ import annotations

import json

from layerscope.cli import main


def _notes(capsys, *argv) -> list[str]:
    assert main(["memory", "layerscope.examples:tiny_gpt", "--format", "json", "--quiet", *argv]) == 0
    return [n for n in json.loads(capsys.readouterr().out)["notes"] if n.startswith("loss")]


def test_memory_loss_flag(capsys):
    # tiny_gpt: token ids in, [1, 32, 1000] logits out over its 1,000-token vocabulary, no labels taken
    assert "next-token cross-entropy" in _notes(capsys)[0]
    assert _notes(capsys, "--loss", "sum") == ["loss (loss='sum'): the sum of the output (the output's own .loss "
                                               "where labels were given)"]


def test_loss_flag_refuses_in_one_line(capsys):
    assert main(["memory", "layerscope.examples:tiny_gpt", "--loss", "ce"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--loss" in err and "cross-entropy" in err
    assert main(["memory", "layerscope.examples:small_cnn", "--loss", "model", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "takes none" in err and "Traceback" not in err
