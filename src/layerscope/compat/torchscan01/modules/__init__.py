"""torchscan 0.1's per-module estimators, with layerscope's counts of the module's forward on the
given input (the module runs once, its state restored). 0.1 and 0.2 take the same arguments, so they
are the same functions: ``layerscope.compat.torchscan.modules``."""

from ...torchscan.modules import module_dmas, module_flops, module_macs, module_rf

__all__ = ["module_dmas", "module_flops", "module_macs", "module_rf"]
