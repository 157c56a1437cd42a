"""``python -m layerscope.torchrun FILE``: one rank of a run (torchrun starts one per rank)."""

import sys

from .worker import worker

worker(sys.argv[1])
