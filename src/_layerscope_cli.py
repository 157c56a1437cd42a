"""The ``layerscope`` console script: ``layerscope.cli.main``, with a Ctrl-C during start-up ending as
one line on stderr and exit status 130, as a Ctrl-C later does (importing torch and layerscope takes
seconds: before, an interrupt there printed a KeyboardInterrupt traceback from the import). This
module lives outside the layerscope package on purpose: importing any module of the package runs
the package's ``__init__`` (torch included) before a line of that module could catch anything."""

import sys

__all__ = ["main"]


def main() -> int:
    try:
        from layerscope.cli import main as cli_main
        return cli_main()
    except KeyboardInterrupt:
        sys.stderr.write("layerscope: interrupted\n")
        return 130


if __name__ == "__main__":
    sys.exit(main())
