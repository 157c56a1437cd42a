"""`python -m layerscope.cli ...`, as the `layerscope` console script (which is src/_layerscope_cli.py:
that one also turns a Ctrl-C while torch and layerscope are imported into one line; here the package
is imported before this module runs)."""

import sys

from . import main

if __name__ == "__main__":      # a tool that imports every module must not exit here
    sys.exit(main())
