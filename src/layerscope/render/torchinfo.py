"""torchinfo's layout as a style: its header titles, its fixed-width rows drawn from each row's
``LayerInfo`` (torchinfo's FormattingOptions) and its footer of totals, byte for byte as torchinfo
1.8 prints them. The numbers are layerscope's (``compat.torchinfo`` builds the rows)."""

from __future__ import annotations

import math
from typing import Any

from .units import megabytes, torchinfo_number

__all__ = ["HEADER_TITLES", "FormattingOptions", "statistics_text"]

HEADER_TITLES = {
    "kernel_size": "Kernel Shape",
    "groups": "Groups",
    "input_size": "Input Shape",
    "output_size": "Output Shape",
    "num_params": "Param #",
    "params_percent": "Param %",
    "mult_adds": "Mult-Adds",
    "trainable": "Trainable",
}


class FormattingOptions:
    """How the table is laid out (torchinfo's FormattingOptions)."""

    def __init__(self, max_depth: int, verbose: int, col_names: tuple[str, ...], col_width: int,
                 row_settings: set[str]) -> None:
        self.max_depth = max_depth
        self.verbose = verbose
        self.col_names = col_names
        self.col_width = col_width
        self.row_settings = row_settings
        self.layer_name_width = 40
        self.ascii_only = "ascii_only" in row_settings
        self.show_var_name = "var_names" in row_settings
        self.show_depth = "depth" in row_settings
        self.hide_recursive_layers = "hide_recursive_layers" in row_settings
        self.params_units = ""          # torchinfo's Units values: "" (none), "auto", "M", "G", "T"
        self.macs_units = "auto"

    @staticmethod
    def str_(val: Any) -> str:
        return str(val) if val else "--"

    def get_start_str(self, depth: int) -> str:
        if depth == 0:
            return ""
        if depth == 1:
            return "+ " if self.ascii_only else "├─"
        return ("|    " if self.ascii_only else "│    ") * (depth - 1) + ("+ " if self.ascii_only else "└─")

    def set_layer_name_width(self, summary_list: list, align_val: int = 5) -> None:
        longest = 0
        for info in summary_list:
            title = info.get_layer_name(self.show_var_name, self.show_depth)
            longest = max(longest, len(title) + info.depth * align_val + 1)
        if longest >= self.layer_name_width:
            self.layer_name_width = math.ceil(longest / align_val) * align_val

    def get_total_width(self) -> int:
        return len(self.col_names) * self.col_width + self.layer_name_width

    def format_row(self, layer_name: str, values: dict[str, str]) -> str:
        line = f"{layer_name:<{self.layer_name_width}} "
        for col in self.col_names:
            line += f"{values.get(col, ''):<{self.col_width}} "
        return line.rstrip() + "\n"

    def header_row(self) -> str:
        extra = (" (var_name)" if self.show_var_name else "") + (":depth-idx" if self.show_depth else "")
        return self.format_row(f"Layer (type{extra})", HEADER_TITLES)

    def layer_info_to_row(self, info, reached_max_depth: bool, total_params: int) -> str:
        values = {
            "kernel_size": self.str_(info.kernel_size),
            "groups": self.str_(info.groups),
            "input_size": self.str_(info.input_size),
            "output_size": self.str_(info.output_size),
            "num_params": info.num_params_to_str(reached_max_depth, max_depth=self.max_depth),
            "params_percent": info.params_percent(total_params, reached_max_depth, max_depth=self.max_depth),
            "mult_adds": info.macs_to_str(reached_max_depth),
            "trainable": self.str_(info.trainable),
        }
        name = info.get_layer_name(self.show_var_name, self.show_depth)
        line = self.format_row(f"{self.get_start_str(info.depth)}{name}", values)
        if self.verbose == 2:
            for inner, inner_values in info.inner_layers.items():
                line += self.format_row(f"{self.get_start_str(info.depth + 1)}{inner}", inner_values)
        return line

    def layers_to_str(self, summary_list: list, total_params: int) -> str:
        out = ""
        for info in summary_list:
            if info.depth > self.max_depth or self.hide_recursive_layers and info.is_recursive:
                continue
            out += self.layer_info_to_row(info, info.depth == self.max_depth, total_params)
        return out


def statistics_text(stats) -> str:
    """torchinfo's printed summary of a ``ModelStatistics``: the table, then its totals."""
    fmt = stats.formatting
    divider = "=" * fmt.get_total_width()
    non_trainable = stats.total_params - stats.trainable_params
    text = (f"{divider}\n{fmt.header_row()}{divider}\n"
            f"{fmt.layers_to_str(stats.summary_list, stats.total_params)}{divider}\n"
            f"Total params{torchinfo_number(stats.total_params, units=fmt.params_units)}\n"
            f"Trainable params{torchinfo_number(stats.trainable_params, units=fmt.params_units)}\n"
            f"Non-trainable params{torchinfo_number(non_trainable, units=fmt.params_units)}\n")
    if stats.input_size:
        out = stats.total_output_bytes
        total = stats.estimated_total_size
        text += (f"Total mult-adds{torchinfo_number(stats.total_mult_adds, units=fmt.macs_units)}\n{divider}\n"
                 f"Input size (MB): {megabytes(stats.total_input)}\n"
                 f"Forward/backward pass size (MB): {megabytes(out)}\n"
                 f"Params size (MB): {megabytes(stats.total_param_bytes)}\n"
                 f"Estimated Total Size (MB): {megabytes(total)}\n")
    return text + divider
