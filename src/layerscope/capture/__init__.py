"""Capture: one run of a model under the module tracker and the aten op recorder."""

from .inputs import iter_tensors, make_inputs, map_tensors, tensor_specs
from .session import capture
from .state import StateGuard, model_device

__all__ = ["capture", "StateGuard", "model_device", "make_inputs", "iter_tensors", "map_tensors",
           "tensor_specs"]
