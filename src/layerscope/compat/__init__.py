"""Front ends with other tools' names, so that switching is a one-line import change:

    from layerscope.compat.torchinfo import summary          # torchinfo.summary
    from layerscope.compat.torchscan import summary, crawl_module      # torchscan 0.2
    from layerscope.compat.torchscan01 import summary, crawl_module    # torchscan 0.1
    from layerscope.compat.deepspeed import get_model_profile, FlopsProfiler
    from layerscope.compat.modelsummary import Statistics    # torchModelSummary

Each keeps the old tool's argument names, defaults, returned attributes and printed layout; the
numbers underneath are layerscope's (docs/compat.md lists where they differ and why). The modules
are imported on first use so that ``import layerscope`` stays light.
"""

import importlib

__all__ = ["torchinfo", "torchscan", "torchscan01", "deepspeed", "modelsummary"]


def __getattr__(name):
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
