"""torchscan 0.1's per-module estimators, with layerscope's counts of the module's forward on the
given input (the module runs once, its state restored). 0.1 and 0.2 take the same arguments, so they
are the same functions (``layerscope.compat.torchscan.modules``), but for 0.2's refusals of options
its formulas were not checked for (NotImplementedError for a MultiheadAttention with add_zero_attn):
0.1 counts those modules."""

from ...torchscan.modules import module_dmas, module_macs, module_rf
from ...torchscan.modules.flops import counted_flops as module_flops

__all__ = ["module_dmas", "module_flops", "module_macs", "module_rf"]
