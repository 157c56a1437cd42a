"""The one exception family layerscope raises on purpose.

Every error a user can cause (bad model, bad inputs, a forward that fails) is a ``LayerscopeError``
subclass with a message that names the problem; the original exception, when there is one, stays
attached as ``__cause__`` so nothing is lost.
"""

from __future__ import annotations

__all__ = ["LayerscopeError", "InputError", "ForwardError", "SpecError", "RegistryError", "PlanError"]


class LayerscopeError(Exception):
    """Base class of every error layerscope raises on purpose."""


class InputError(LayerscopeError, ValueError):
    """The model or the example inputs handed to layerscope are not usable."""


class SpecError(LayerscopeError, ValueError):
    """A model spec (``file.py:factory``, ``hf:Config``, ...) cannot be resolved."""


class RegistryError(LayerscopeError):
    """The cost registry was used wrongly (for example an op registered twice)."""


class ForwardError(LayerscopeError, RuntimeError):
    """The model's forward (or backward) raised; names the layer that failed and what it received."""

    def __init__(self, message: str, *, path: str | None = None, module_type: str | None = None,
                 input_shapes: tuple = ()) -> None:
        super().__init__(message)
        self.path = path
        self.module_type = module_type
        self.input_shapes = input_shapes


class PlanError(LayerscopeError, ValueError):
    """No pipeline split satisfies the constraints; says what would (a memory limit, a stage count)."""

    def __init__(self, message: str, *, min_memory: int | None = None, min_stages: int | None = None) -> None:
        super().__init__(message)
        self.min_memory = min_memory
        self.min_stages = min_stages
