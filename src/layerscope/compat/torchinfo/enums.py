"""torchinfo's enums (``torchinfo.enums``): the names its callers pass for columns, row settings, modes,
units and verbosity. Each member is its string (or int) value, so ``"num_params"`` and
``ColumnSettings.NUM_PARAMS`` are interchangeable, and it formats as that value on every Python
(torchinfo 1.8's own members print as ``Units.MEGABYTES`` from Python 3.11 on)."""

from __future__ import annotations

from enum import Enum, IntEnum, unique

__all__ = ["ColumnSettings", "Mode", "RowSettings", "Units", "Verbosity"]


class _StrEnum(str, Enum):
    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return format(str.__str__(self), spec)


@unique
class Mode(_StrEnum):
    TRAIN = "train"
    EVAL = "eval"
    SAME = "same"


@unique
class RowSettings(_StrEnum):
    DEPTH = "depth"
    VAR_NAMES = "var_names"
    ASCII_ONLY = "ascii_only"
    HIDE_RECURSIVE_LAYERS = "hide_recursive_layers"


@unique
class ColumnSettings(_StrEnum):
    KERNEL_SIZE = "kernel_size"
    INPUT_SIZE = "input_size"
    OUTPUT_SIZE = "output_size"
    NUM_PARAMS = "num_params"
    PARAMS_PERCENT = "params_percent"
    MULT_ADDS = "mult_adds"
    TRAINABLE = "trainable"


@unique
class Units(_StrEnum):
    AUTO = "auto"
    MEGABYTES = "M"
    GIGABYTES = "G"
    TERABYTES = "T"
    NONE = ""


@unique
class Verbosity(IntEnum):
    QUIET, DEFAULT, VERBOSE = 0, 1, 2
