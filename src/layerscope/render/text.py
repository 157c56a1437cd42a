"""Plain-text table (for files, pipes and logs)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .columns import build_rows, footer_lines

if TYPE_CHECKING:
    from ..report import Report


def render_text(rep: "Report", depth: int | None = None, columns=None, fold: bool = True) -> str:
    header, body = build_rows(rep, depth, columns, fold)
    return text_table(header, body, footer_lines(rep))


def text_table(header: list[str], body: list[list[str]], footer: list[tuple[str, str]]) -> str:
    """A tree column on the left, right-aligned numbers, and a key/value footer."""
    widths = [max(len(row[i]) for row in [header] + body) for i in range(len(header))]

    def line(row):
        first = row[0].ljust(widths[0])
        rest = [cell.rjust(w) for cell, w in zip(row[1:], widths[1:])]
        return "  ".join([first] + rest).rstrip()

    total = sum(widths) + 2 * (len(widths) - 1)
    out = ["=" * total, line(header), "=" * total]
    out += [line(r) for r in body]
    out.append("=" * total)
    kw = max((len(k) for k, _ in footer), default=0)
    out += [f"{k.ljust(kw)}  {v}" for k, v in footer]
    out.append("=" * total)
    return "\n".join(out) + "\n"
