"""What every report does with its rendered text: print it, write it, hand rows to pandas."""

from __future__ import annotations

import sys
from typing import Callable, Iterable, TextIO

from ..errors import InputError

__all__ = ["print_report", "write_text", "dataframe", "html_table", "ReportOutput"]


def print_report(rich: Callable, plain: Callable[[], str], file: TextIO | None = None) -> None:
    """A rich table on a terminal, plain text otherwise."""
    file = file or sys.stdout
    if getattr(file, "isatty", lambda: False)():
        from rich.console import Console
        Console(file=file).print(rich())
    else:
        file.write(plain())


def write_text(text: str, path: str | None) -> str:
    """Write ``text`` to ``path`` when one is given; return it either way."""
    if path is not None:
        with open(path, "w", encoding="utf-8", newline="") as f:
            f.write(text)
    return text


def dataframe(rows: Iterable[dict]):
    """The rows as a pandas DataFrame (needs the ``pandas`` extra)."""
    try:
        import pandas as pd
    except ImportError as e:
        raise InputError("to_dataframe() needs pandas: pip install 'layerscope[pandas]'") from e
    return pd.DataFrame(list(rows))


def html_table(header: list[str], body: list[list[str]], footer: list[tuple[str, str]], title: str) -> str:
    """A plain HTML table (no script: notebook front ends may strip scripts) of rendered rows."""
    from html import escape

    def cells(tag: str, row: list[str]) -> str:
        first, rest = row[0], row[1:]
        return (f"<{tag} style='text-align:left;white-space:pre;font-family:monospace'>{escape(first)}</{tag}>"
                + "".join(f"<{tag} style='text-align:right'>{escape(c)}</{tag}>" for c in rest))
    rows = "".join(f"<tr>{cells('td', r)}</tr>" for r in body)
    foot = "".join(f"<tr><td style='text-align:left'><b>{escape(k)}</b></td>"
                   f"<td colspan='{max(len(header) - 1, 1)}' style='text-align:left'>{escape(v)}</td></tr>"
                   for k, v in footer)
    return (f"<div><b>{escape(title)}</b><table><thead><tr>{cells('th', header)}</tr></thead>"
            f"<tbody>{rows}</tbody><tfoot>{foot}</tfoot></table></div>")


class ReportOutput:
    """What every report kind renders the same way: ``to_json()`` (of its ``to_dict()``), ``str()``
    (its ``table()``), ``to_html()`` / ``save_html()`` (the self-contained page with
    charts; pass the other reports of the same model to put them on one page) and
    ``_repr_html_()`` (a plain table, which Jupyter shows for a report left at the end of a cell).
    A class sets ``_html_part`` (summary, memory, latency or plan) and ``_html_rows(depth)``."""

    _html_part = "summary"

    def to_json(self, path: str | None = None, indent: int | None = 2) -> str:
        import json
        return write_text(json.dumps(self.to_dict(), indent=indent), path)

    def __str__(self) -> str:
        return self.table()

    def _html_rows(self, depth: int | None):            # -> header, body, footer  # pragma: no cover
        raise NotImplementedError

    def to_html(self, *, summary=None, memory=None, latency=None, plan=None, title: str | None = None) -> str:
        from .html import html_page
        parts = {"summary": summary, "memory": memory, "latency": latency, "plan": plan}
        parts[self._html_part] = self
        return html_page(title, **{k: v.to_dict() if hasattr(v, "to_dict") else v for k, v in parts.items()
                                   if v is not None})

    def save_html(self, path: str, **others) -> str:
        """Write the page to ``path``; returns the HTML."""
        return write_text(self.to_html(**others), path)

    def _repr_html_(self) -> str:
        header, body, footer = self._html_rows(3)
        return html_table(header, body, footer, f"layerscope: {self.model_name}")
