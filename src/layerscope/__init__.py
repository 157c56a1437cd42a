"""layerscope: what is inside any PyTorch model, layer by layer, with numbers you can trust."""

from .api import activations, analyze, summary
from .costs import CostOptions
from .errors import ForwardError, InputError, LayerscopeError, RegistryError, SpecError
from .report import Report
from .trace import (Costs, Coverage, LayerRecord, OpEvent, ParamSpec, ReceptiveField, TensorSpec, Totals,
                    Trace)

__version__ = "0.1.0"

__all__ = [
    "analyze", "summary", "activations", "Report", "Trace", "LayerRecord", "OpEvent", "Costs",
    "Totals", "Coverage", "TensorSpec", "ParamSpec", "ReceptiveField", "CostOptions",
    "LayerscopeError", "InputError", "ForwardError", "SpecError", "RegistryError", "__version__",
]
