"""What every report does with its rendered text: print it, write it, hand rows to pandas."""

from __future__ import annotations

import sys
from typing import Callable, Iterable, TextIO

from ..errors import InputError

__all__ = ["print_report", "write_text", "dataframe"]


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
