"""`layerscope ...` command line. The only place that prints or exits.

One module per job: parser (the argparse tree), common (output, spinner, checks, building the
model), and one module per subcommand family (summary, onnx, split, report)."""

from __future__ import annotations

import sys
from typing import Sequence

from ..errors import LayerscopeError
from .helptext import _EXAMPLES
from .onnx import _onnx, _onnx_tile
from .parser import EXIT_ERROR, EXIT_INTERNAL, EXIT_USAGE, _parser
from .report import _compare, _list_presets, _report
from .split import _split
from .summary import _memory, _profile, _summary

__all__ = ["EXIT_ERROR", "EXIT_INTERNAL", "EXIT_USAGE", "LayerscopeError", "_EXAMPLES", "_parser", "main"]


def main(argv: Sequence[str] | None = None) -> int:
    try:
        ns = _parser().parse_args(argv)
    except SystemExit as e:          # --help and --version exit 0; a usage error prints one line
        if e.code in (0, None):
            raise
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    commands = {"summary": _summary, "memory": _memory, "split": _split, "profile": _profile, "onnx": _onnx,
                "onnx-tile": _onnx_tile, "report": _report, "compare": _compare, "list-presets": _list_presets}
    try:
        if ns.command in commands:
            return commands[ns.command](ns)
    except LayerscopeError as e:
        print(f"layerscope: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("layerscope: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # never a traceback for the user; the message says what broke
        print(f"layerscope: internal error: {type(e).__name__}: {e} (please report this)", file=sys.stderr)
        return EXIT_INTERNAL
    return EXIT_USAGE

