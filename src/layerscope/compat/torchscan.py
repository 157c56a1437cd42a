"""Until torchscan 0.2's front end lands: 0.1's."""
from .torchscan01 import *  # noqa: F401,F403
from .torchscan01 import __all__  # noqa: F401
