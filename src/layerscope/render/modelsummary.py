"""torchModelSummary's layout as a style: its row of fixed right-aligned columns (one per module
call, the name indented by depth), its header titles and its footer of totals, byte for byte as
torchModelSummary's ``Statistics`` prints them. It draws plain values; the numbers are layerscope's
(``compat.modelsummary`` builds them) and every one is written by ``render.units``. Byte figures
arrive in MB (1024**2 bytes), the unit of torchModelSummary's attributes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .units import decimals, digits, modelsummary_mult_adds, params

__all__ = ["HEADERS", "Totals", "layer_line", "statistics_text"]

_NAME_WIDTH = 40
# (title, width) of each column after the name; every cell is right-aligned in its width
HEADERS = (("Input Shape", 30), ("Output Shape", 30), ("Param #", 30), ("Input Size (MB)", 30),
           ("Forward & Backward Size (MB)", 35), ("Params Size (MB)", 30), ("Estimated Total Size (MB)", 30))


@dataclass(frozen=True)
class Totals:
    """The footer. ``with_input``: a forward ran (the mult-adds and byte lines are printed)."""
    params: int
    trainable: int
    mult_adds: int
    input_mb: float
    output_mb: float
    params_mb: float
    size_mb: float
    with_input: bool


def layer_line(class_name: str, depth: int, depth_index: int, input_size, output_size, num_params: int,
               input_mb: float, output_mb: float, params_mb: float, size_mb: float) -> str:
    """One module call's row: ``Conv2d: 1-1`` indented two spaces per level below the first."""
    name = f"{'  ' * (depth - 1)}{class_name}: {depth}-{depth_index}"
    cells = (str(input_size), str(output_size), params(num_params), decimals(input_mb), decimals(output_mb),
             decimals(params_mb), decimals(size_mb))
    return f"{name:<{_NAME_WIDTH}}" + "".join(f"{c:>{w}}" for c, (_, w) in zip(cells, HEADERS))


def statistics_text(lines: Sequence[str], totals: Totals) -> str:
    """The whole printout around the rows ``layer_line`` drew: rules as wide as the widest row."""
    width = max((len(line) for line in lines), default=_NAME_WIDTH)
    bold, slim = "=" * width, "-" * width
    t = totals
    text = (f"{bold}\nTotal # of Params: {digits(t.params)}\nTrainable Params #: {digits(t.trainable)}\n"
            f"Non Trainable Params #: {digits(t.params - t.trainable)}\n")
    if t.with_input:
        text += (f"{slim}\nTotal mult-adds {modelsummary_mult_adds(t.mult_adds)}\n"
                 f"Input size (MB): {decimals(t.input_mb)}\n"
                 f"Forward/backward pass size (MB): {decimals(t.output_mb)}\n"
                 f"Params size (MB): {decimals(t.params_mb)}\n"
                 f"Estimated Total Size (MB): {decimals(t.size_mb)}\n")
    if lines:
        text += (bold + "\n" + f"{'Layer Name (type)':<{_NAME_WIDTH}}"
                 + "".join(f"{title:>{w}}" for title, w in HEADERS) + "\n")
        text += "".join(f"{line}\n" for line in lines)
    return text + bold
