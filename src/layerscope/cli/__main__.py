"""`python -m layerscope.cli ...`, as the `layerscope` console script."""

import sys

from . import main

if __name__ == "__main__":      # a tool that imports every module must not exit here
    sys.exit(main())
