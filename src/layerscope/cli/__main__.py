"""`python -m layerscope.cli ...`, as the `layerscope` console script."""

import sys

from . import main

sys.exit(main())
