"""torchscan 0.2's per-module functions with layerscope's counts: each runs the module's forward on
the given inputs under layerscope's op recorder (the module comes out as it went in)."""

from .flops import *  # noqa: F401,F403
from .macs import *  # noqa: F401,F403
from .memory import *  # noqa: F401,F403
from .receptive import *  # noqa: F401,F403
