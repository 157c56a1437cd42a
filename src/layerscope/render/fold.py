"""Folding of identical repeated blocks, for every report kind and every view.

``layers.0-79: LlamaDecoderLayer x80 (each)`` stands for 80 sibling blocks whose paths end in
consecutive numbers, of one type, whose rows (their own and every descendant's) hold the same values
in every column that may be folded: nothing shown is hidden by a fold, it only stops repeating.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..reports.table import Row, Table

__all__ = ["FOLD_MIN", "Fold", "subtree_ends", "find_folds", "roles"]

FOLD_MIN = 3             # runs of at least this many identical blocks fold into one row
_INDEXED = re.compile(r"^(.*?)(\d+)$")


@dataclass(frozen=True, slots=True)
class Fold:
    """A run of identical blocks: ``blocks`` are the row positions of each block's own row; the
    rows of the first block's subtree stay, the others' are hidden. ``end``: the last row position
    of the last block's subtree."""

    blocks: tuple[int, ...]
    end: int
    prefix: str                       # the path before the block number: "model.layers."
    first: str                        # "0"
    last: str                         # "79"

    @property
    def count(self) -> int:
        return len(self.blocks)

    @property
    def label(self) -> str:
        """``layers.0-79``-style name of the run, from the first block's local name."""
        return f"{self.first}-{self.last}"


def subtree_ends(rows: tuple[Row, ...] | list[Row]) -> list[int]:
    """end[i]: the position of the last row of row i's subtree (rows in pre-order)."""
    n = len(rows)
    end = list(range(n))
    for i in range(n - 1, -1, -1):
        j = i + 1
        while j < n and rows[j].depth > rows[i].depth:
            j = end[j] + 1
        end[i] = j - 1
    return end


def find_folds(table: Table, min_run: int = FOLD_MIN) -> list[Fold]:
    """The runs of identical blocks in a tree table, outermost first (a fold's hidden blocks are
    not searched further)."""
    rows = table.rows
    if not table.tree or not rows:
        return []
    keep = [j for j, c in enumerate(table.columns) if c.fold]
    end = subtree_ends(rows)
    n = len(rows)

    def signature(i: int) -> tuple:
        rel = len(rows[i].path)
        return tuple((rows[k].path[rel:], rows[k].type, tuple(rows[k].values[j] for j in keep),
                      tuple(rows[k].texts[j] for j in keep), tuple(rows[k].suffixes[j] for j in keep))
                     for k in range(i, end[i] + 1))

    out: list[Fold] = []
    jump: dict[int, int] = {}          # the first hidden row of a fold -> the row after the fold
    i = 0
    while i < n:
        if i in jump:
            i = jump[i]
            continue
        r = rows[i]
        m = _INDEXED.match(r.path) if r.call_index == 0 else None
        run = [i]
        if m:
            prefix, num, sig = m.group(1), int(m.group(2)), None
            k = end[i] + 1
            while k < n and rows[k].depth == r.depth and rows[k].parent == r.parent and rows[k].type == r.type \
                    and rows[k].path == f"{prefix}{num + len(run)}" and rows[k].call_index == 0:
                sig = sig or signature(i)
                if signature(k) != sig:
                    break
                run.append(k)
                k = end[k] + 1
            if len(run) >= min_run:
                out.append(Fold(tuple(run), end[run[-1]], prefix, m.group(2), rows[run[-1]].path[len(prefix):]))
                jump[end[i] + 1] = end[run[-1]] + 1     # the first block's own rows stay, then skip
        i += 1
    return out


def roles(layers) -> dict[str, str]:
    """Each layer's role across repeated blocks: its path with every block number replaced by
    ``*`` (``model.layers.*.mlp.down_proj``), so a chart sums the 80 copies of one role. A number is
    a block number when the module it names has a sibling, also numbered, of the same type and the
    same structure below it (paths and types), and either all its numbered siblings are alike (a
    ModuleList of blocks or of experts) or it has modules of its own: ``mlp.0`` and ``mlp.2`` (two
    Linear of a Sequential) stay apart, ``layers.3`` and ``layers.4`` are one role. ``layers``: (path, type) of every module call."""
    types: dict[str, str] = {}
    for path, typ in layers:
        types.setdefault(path, typ)
    below: dict[str, list[tuple[str, str]]] = {p: [] for p in types}
    for path, typ in types.items():
        parts = path.split(".") if path else []
        for k in range(len(parts) - 1, 0, -1):
            anc = ".".join(parts[:k])
            if anc in below:
                below[anc].append((".".join(parts[k:]), typ))
    numbered: dict[str, list[str]] = {}
    for path in types:
        parent, _, local = path.rpartition(".")
        if local.isdigit():
            numbered.setdefault(parent, []).append(path)
    block: set[str] = set()
    for kids in numbered.values():
        sig = {k: (types[k], tuple(sorted(below[k]))) for k in kids}
        counts: dict[tuple, int] = {}
        for v in sig.values():
            counts[v] = counts.get(v, 0) + 1
        if len(counts) == 1 and len(kids) > 1:
            block.update(kids)               # all alike (a ModuleList of blocks, of experts)
        else:                                # a mix (a Sequential): only blocks with a structure of their own
            block.update(k for k in kids if counts[sig[k]] > 1 and below[k])
    out = {}
    for path in types:
        parts = path.split(".") if path else []
        out[path] = ".".join("*" if ".".join(parts[:k + 1]) in block else part for k, part in enumerate(parts))
    return out
