"""torchinfo's ``torchinfo.formatting``: the column titles and the table's layout options."""

from ...render.torchinfo import HEADER_TITLES, FormattingOptions
from ...render.units import TORCHINFO_UNITS
from .enums import ColumnSettings, RowSettings, Units, Verbosity

__all__ = ["HEADER_TITLES", "CONVERSION_FACTORS", "FormattingOptions", "ColumnSettings", "RowSettings", "Units",
           "Verbosity"]

CONVERSION_FACTORS = {Units(u): f for u, f in TORCHINFO_UNITS.items()} | {Units.NONE: 1}
