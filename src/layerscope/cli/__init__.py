"""`layerscope ...` command line. The only place that prints or exits.

One module per job: parser (the argparse tree), common (output, spinner, checks, building the
model), and one module per subcommand family (summary, onnx, split, report)."""

from __future__ import annotations

import sys
from typing import Sequence

from ..errors import LayerscopeError
from .common import check_view_options
from .helptext import _EXAMPLES
from .onnx import run_onnx, run_onnx_tile
from .parser import EXIT_BROKEN_PIPE, EXIT_ERROR, EXIT_INTERNAL, EXIT_USAGE, build_parser
from .report import run_compare, run_list_presets, run_report
from .split import run_split
from .parallel import run_parallel
from .summary import run_memory, run_profile, run_summary

__all__ = ["EXIT_ERROR", "EXIT_INTERNAL", "EXIT_USAGE", "LayerscopeError", "_EXAMPLES", "build_parser", "main"]


def _value_options(parser) -> set[str]:
    """Option strings, in every subcommand, that take a value."""
    out: set[str] = set()
    for action in parser._actions:
        if action.option_strings and action.nargs != 0:
            out.update(action.option_strings)
        for sub in (getattr(action, "choices", None) or {}).values() if hasattr(action, "_name_parser_map") else ():
            out |= _value_options(sub)
    return out


def _join_negative_values(parser, argv: list[str]) -> list[str]:
    """`--limit -5GiB` -> `--limit=-5GiB`: argparse takes a value that starts with '-' and is not a plain
    number for an option of its own and fails with a usage error; joined, the value reaches the check that
    says what is wrong with it (a size must be positive)."""
    takes_value = _value_options(parser)
    out: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        if (tok in takes_value and i + 1 < len(argv) and len(argv[i + 1]) > 1 and argv[i + 1][0] == "-"
                and (argv[i + 1][1].isdigit() or argv[i + 1][1] == ".")):
            out.append(f"{tok}={argv[i + 1]}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def main(argv: Sequence[str] | None = None) -> int:
    try:
        return _main(argv)
    except KeyboardInterrupt:     # also while the parser is built and the command line read
        print("layerscope: interrupted", file=sys.stderr)
        return 130


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    argv = _join_negative_values(parser, list(sys.argv[1:] if argv is None else argv))
    try:
        ns = parser.parse_args(argv)
    except SystemExit as e:          # --help and --version exit 0; a usage error prints one line
        if e.code in (0, None):
            raise
        return int(e.code) if isinstance(e.code, int) else EXIT_USAGE
    commands = {"summary": run_summary, "memory": run_memory, "split": run_split, "profile": run_profile, "onnx": run_onnx,
                "onnx-tile": run_onnx_tile, "report": run_report, "compare": run_compare, "list-presets": run_list_presets,
                "parallel": run_parallel}
    try:
        if ns.command in commands:
            check_view_options(ns)
            return commands[ns.command](ns)
    except LayerscopeError as e:
        print(f"layerscope: error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except BrokenPipeError:
        # the reader went away (`| true`, a pager quit early): nothing more to say, and nothing more
        # to write: stdout goes to devnull so that the interpreter's own flush at exit cannot fail too
        import os
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):     # a stdout with no file descriptor (a test's capture)
            pass
        return EXIT_BROKEN_PIPE
    except Exception as e:  # never a traceback for the user; the message says what broke
        print(f"layerscope: internal error: {type(e).__name__}: {e} (please report this)", file=sys.stderr)
        return EXIT_INTERNAL
    return EXIT_USAGE

