"""torchinfo's ``torchinfo.model_statistics``: the ``ModelStatistics`` a summary returns."""

from .torchinfo import ModelStatistics

__all__ = ["ModelStatistics"]
