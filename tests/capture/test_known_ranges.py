"""Index bounds past the limit on values carried beside a meta run (issue 58, item 1;
capture/ranges.py). capture/known.py carries values of up to LIMIT = 4,194,304 elements; past it
`layerscope summary hf:gpt2 --input-ids 1,4194305` exited 0 with 324.78 P MACs, pricing positions
1,024 .. 4,194,304 of GPT-2's 1,024-row position table. Tensors too large to carry keep a range
(min, max) instead, and an index op whose range is not known says so in the report.

Everything here runs on meta: the 4,194,305-element tensors are never computed (the ids given are
real, 32 MiB, read once for their min and max)."""

from __future__ import annotations

import contextlib
import io

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.capture.known import LIMIT
from layerscope.errors import ForwardError

N = LIMIT + 1          # 4,194,305: the first length whose positions were not carried


def test_limit_is_the_one_the_issue_names():
    assert LIMIT == 4_194_304


def test_gpt2_given_4194305_tokens_fails_at_wpe_like_1025():
    """The issue's command, in-process: both lengths fail at transformer.wpe, 1,024 rows (the
    real run fails there: position 1,024 is past the table)."""
    pytest.importorskip("transformers")
    from layerscope.cli import main
    for tokens in (1025, N):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            rc = main(["summary", "hf:gpt2", "--input-ids", f"1,{tokens}"])
        assert rc != 0, tokens
        assert f"layer 'transformer.wpe' (Embedding) called with Tensor[1, {tokens}] int64: IndexError: " \
               "index out of range in self" in err.getvalue(), err.getvalue()


class Positions(nn.Module):
    """Token embeddings (10 rows) plus positions ``where(arange(S))`` from a table of ``rows``."""

    def __init__(self, rows: int, where=lambda p: p) -> None:
        super().__init__()
        self.tok = nn.Embedding(10, 2)
        self.pos = nn.Embedding(rows, 2)
        self.where = where

    def forward(self, ids):
        p = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0).expand(ids.shape[0], -1)
        return self.tok(ids) + self.pos(self.where(p))


def _meta(rows, where=lambda p: p):
    """A CPU model (analyze(device="meta") runs it with meta copies of its weights and inputs; the
    ids' values go along beside them, as the issue's ``hf:gpt2`` summary does)."""
    return Positions(rows, where)


def test_positions_past_the_limit_check_their_range():
    ids = torch.zeros(1, N, dtype=torch.long)
    # positions 0 .. N-1 = 4,194,304: a table of N rows holds them, N-1 rows does not
    rep = ls.analyze(_meta(N), ids, device="meta")
    assert not [n for n in rep.notes if "bounds" in n]
    with pytest.raises(ForwardError, match=r"layer 'pos' .*IndexError: index out of range in self"):
        ls.analyze(_meta(N - 1), ids, device="meta")
    # through ops that move the range: (p + 3) * 2 - 1 has max (4,194,304 + 3) * 2 - 1 = 8,388,613
    shifted = lambda p: (p + 3) * 2 - 1         # noqa: E731
    ls.analyze(_meta(8_388_614, shifted), ids, device="meta")
    with pytest.raises(ForwardError, match=r"layer 'pos' .*index out of range"):
        ls.analyze(_meta(8_388_613, shifted), ids, device="meta")
    # cat of whole parts, a constant clamp: the extremes stay values some element holds (exact)
    with pytest.raises(ForwardError, match=r"layer 'pos' .*index out of range"):
        ls.analyze(_meta(N - 1, lambda p: torch.cat([p, p.flip(1)], 1).clamp(min=0)), ids, device="meta")
    # clamped below the table's size: max 99 for a 100-row table
    ls.analyze(_meta(100, lambda p: p.clamp(max=99)), ids, device="meta")


def test_a_range_wider_than_the_values_never_fails_a_run_that_works():
    """A slice keeps the range of what it is cut from, which may be wider than its values: past the
    table's size it proves nothing, so the run goes on and the report says the bounds were not
    checked (the real run of these positions 0 .. 9 in a 10-row table works)."""
    ids = torch.zeros(1, N, dtype=torch.long)
    first10 = lambda p: p[:, :10].repeat(1, p.shape[1] // 10 + 1)[:, :p.shape[1]]     # noqa: E731
    m = _meta(10, first10)
    with torch.no_grad():
        m(ids[:, :64])                         # a shorter real run of the same positions: fine
    rep = ls.analyze(m, ids, device="meta")
    assert [n for n in rep.notes if "index bounds not checked" in n], rep.notes
    # within the table, an inexact range is checked: ones.cumsum(-1) - 1 lies in [0, N - 1]
    rep = ls.analyze(_meta(N, lambda p: torch.ones_like(p).cumsum(-1) - 1), ids, device="meta")
    assert not [n for n in rep.notes if "bounds" in n], rep.notes


def test_ids_given_past_the_limit_are_checked_by_their_min_and_max():
    ids = torch.zeros(1, N, dtype=torch.long)
    ids[0, -1] = 10            # one id past the 10-row token table: the real run fails at 'tok'
    with pytest.raises(ForwardError, match=r"layer 'tok' .*IndexError: index out of range in self"):
        ls.analyze(_meta(N), ids, device="meta")
    ids[0, -1] = 9
    ls.analyze(_meta(N), ids, device="meta")


def test_an_index_without_a_range_past_the_limit_is_said_unchecked():
    ids = torch.zeros(1, N, dtype=torch.long)
    # bitwise_and has no range rule here: the positions' bounds cannot be told without their values
    rep = ls.analyze(_meta(N, lambda p: p & 0xFFFFFF), ids, device="meta")
    notes = [n for n in rep.notes if "index bounds not checked" in n]
    assert len(notes) == 1 and "embedding" in notes[0], rep.notes
    # a placeholder without values (meta ids given) is not what the note is about: no note, as before
    rep = ls.analyze(_meta(10), torch.empty(1, 8, dtype=torch.long, device="meta"), device="meta")
    assert not [n for n in rep.notes if "bounds" in n]


def test_simulated_step_checks_the_range_too():
    ids = torch.zeros(1, N, dtype=torch.long)
    with pytest.raises(ForwardError, match=r"IndexError: index out of range in self"):
        ls.memory(Positions(N - 1), ids)


def test_a_write_through_a_view_leaves_the_range_unchecked_not_silent():
    ids = torch.zeros(1, N, dtype=torch.long)

    def written(p):
        p = p.clone()
        p[:, :5] = 3                  # the base's old range may not hold: not dropped, noted
        return p
    rep = ls.analyze(_meta(N, written), ids, device="meta")
    assert [n for n in rep.notes if "index bounds not checked" in n], rep.notes

    def filled(p):
        return p.clone().fill_(2)      # every element 2: an exact range again
    assert not [n for n in ls.analyze(_meta(3, filled), ids, device="meta").notes if "bounds" in n]
    with pytest.raises(ForwardError, match=r"layer 'pos' .*index out of range"):
        ls.analyze(_meta(2, filled), ids, device="meta")
