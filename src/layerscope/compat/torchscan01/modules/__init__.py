"""torchscan 0.1's per-module estimators, with layerscope's counts of the module's forward on the
given input (the module runs once, its state restored; see ``_count``)."""

from .flops import module_flops
from .macs import module_macs
from .memory import module_dmas
from .receptive import module_rf

__all__ = ["module_dmas", "module_flops", "module_macs", "module_rf"]
