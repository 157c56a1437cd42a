"""torchinfo's ``summary()`` with layerscope's numbers underneath.

    from layerscope.compat.torchinfo import summary      # was: from torchinfo import summary
    stats = summary(model, (1, 3, 224, 224), col_names=["input_size", "output_size", "num_params",
                    "mult_adds"], depth=2, row_settings=["var_names"], verbose=0)
    stats.total_params, stats.total_mult_adds, stats.summary_list[3].output_size
    print(stats)                                           # torchinfo's layout

The arguments, their defaults, the returned ``ModelStatistics`` attributes and the printed layout
follow torchinfo (1.8: the "(MB)" footer its README shows). The numbers come from
``layerscope.analyze`` and differ from torchinfo's where torchinfo guesses (see docs/compat.md):

- ``total_mult_adds`` and each row's Mult-Adds are the MACs of the ops that really ran (aten level),
  not ``params x output positions``; an embedding lookup has no MACs, an LSTM counts its matmuls.
  A container shows the MACs of the ops it ran itself (functional matmuls, attention), so the rows
  shown add up to the total; torchinfo shows ``--`` and leaves those out of its total.
- "Forward/backward pass size" is the peak of a simulated forward + backward step (no optimizer)
  minus the parameters and the inputs: activations kept for backward, gradients and temporaries,
  instead of ``2 x output bytes of layers with parameters``. "Estimated Total Size" is then the
  simulated peak itself. If that simulation cannot run (e.g. integer outputs, nothing to
  differentiate), a forward-only simulation is used and ``memory_basis`` says so.
- ``depth=-1`` shows every depth (torchinfo prints an empty table); ``cache_forward_pass`` is
  accepted and has no effect (layerscope keeps no global cache); the model is never moved:
  ``device`` only places inputs built from ``input_size`` and must match the model's device.
- Modules that were never called (an unused branch) have no row; a module called twice has a
  ``(recursive)`` row per later call, as in torchinfo.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Iterable

import torch
from torch import nn

from ..errors import InputError, LayerscopeError
from ..reports.summary import Report
from ..trace import Coverage

__all__ = ["summary", "layerscope_summary", "ModelStatistics", "LayerInfo", "FormattingOptions", "COLUMN_NAMES",
           "ROW_SETTINGS"]

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
COLUMN_NAMES = tuple(HEADER_TITLES)
ROW_SETTINGS = ("depth", "var_names", "ascii_only", "hide_recursive_layers")
DEFAULT_COLUMN_NAMES = ("output_size", "num_params")
REQUIRES_INPUT = {"input_size", "output_size", "mult_adds"}


# ---- LayerInfo -----------------------------------------------------------------------------------

class LayerInfo:
    """One row of torchinfo's ``summary_list``: one call of one module (torchinfo's LayerInfo
    attributes, plus torchModelSummary's ``input_bytes``, ``params_bytes`` and ``size_bytes``)."""

    def __init__(self, var_name: str, module: nn.Module | None, depth: int,
                 parent_info: "LayerInfo | None" = None, class_name: str | None = None) -> None:
        self.layer_id = id(module) if module is not None else None
        self.module = module
        self.class_name = class_name or (module._get_name() if module is not None else "?")
        self.inner_layers: dict[str, dict[str, str]] = {}
        self.depth = depth
        self.depth_index: int | None = None
        self.children: list[LayerInfo] = []
        self.executed = False
        self.parent_info = parent_info
        self.var_name = var_name
        self.is_leaf_layer = not any(module.children()) if module is not None else True
        self.is_recursive = False
        self.input_size: list[int] = []
        self.output_size: list[int] = []
        self.kernel_size = _kernel_size(module)
        self.groups = int(module.groups) if module is not None and isinstance(
            getattr(module, "groups", None), int) else None
        self.trainable_params = 0
        self.num_params = 0
        self.param_bytes = 0
        self.input_bytes = 0
        self.output_bytes = 0
        self.macs = 0            # forward MACs of this call's whole subtree (layerscope's count)
        self.self_macs = 0       # MACs of the ops this call ran itself (shown for containers)
        self.flops = 0
        self.leftover_params_count = 0   # params held directly (counted at this row)
        self.record = None       # the layerscope LayerRecord behind this row (None without a forward)

    # torchModelSummary's names for the same numbers
    @property
    def params_bytes(self) -> int:
        return self.param_bytes

    @property
    def size_bytes(self) -> int:
        """Bytes this call holds: its parameters plus its outputs."""
        return self.param_bytes + self.output_bytes

    @property
    def trainable(self) -> str:
        if self.num_params == 0:
            return "--"
        if self.trainable_params == 0:
            return "False"
        return "True" if self.num_params == self.trainable_params else "Partial"

    def __repr__(self) -> str:
        return f"{self.class_name}: {self.depth}"

    def get_layer_name(self, show_var_name: bool, show_depth: bool) -> str:
        name = self.class_name
        if show_var_name and self.var_name:
            name += f" ({self.var_name})"
        if show_depth and self.depth > 0:
            name += f": {self.depth}"
            if self.depth_index is not None:
                name += f"-{self.depth_index}"
        return name

    def leftover_params(self) -> int:
        return self.leftover_params_count

    def num_params_to_str(self, reached_max_depth: bool) -> str:
        if self.num_params == 0:
            return "--"
        if self.is_recursive:
            return "(recursive)"
        if reached_max_depth or self.is_leaf_layer:
            s = f"{self.num_params:,}"
            return s if self.trainable_params else f"({s})"
        left = self.leftover_params()
        return f"{left:,}" if left > 0 else "--"

    def macs_to_str(self, reached_max_depth: bool) -> str:
        # leaves and rows at the depth limit show their subtree; a container above the limit shows
        # only its own ops, so that the rows shown add up to the total
        n = self.macs if (reached_max_depth or self.is_leaf_layer) else self.self_macs
        return f"{n:,}" if n > 0 else "--"

    def params_percent(self, total_params: int, reached_max_depth: bool, precision: int = 2) -> str:
        spacing = 5
        zero = f"{' ' * spacing}--"
        if total_params == 0:
            return zero
        if self.is_recursive:
            return "(recursive)"
        params = self.num_params if reached_max_depth or self.is_leaf_layer else self.leftover_params()
        if params == 0:
            return zero
        return f"{params / total_params:>{precision + spacing}.{precision}%}"

    def _fill_params(self, module: nn.Module, root: bool) -> None:
        """torchinfo's per-module parameter counts (the module's whole subtree, each tensor once)
        and, for verbose=2, one inner row per parameter."""
        self.num_params = self.trainable_params = self.param_bytes = 0
        final = ""
        for name, p in module.named_parameters():
            n = p.numel()
            self.num_params += n
            self.param_bytes += n * p.element_size()
            if p.requires_grad:
                self.trainable_params += n
            ksize = list(p.shape)
            if name == "weight" and len(ksize) > 1:
                ksize[0], ksize[1] = ksize[1], ksize[0]
            if not root or "." not in name:
                self.inner_layers[name] = {"kernel_size": str(ksize), "num_params": f"├─{n:,}"}
                final = name
        if final:
            self.inner_layers[final]["num_params"] = "└─" + self.inner_layers[final]["num_params"][2:]
        self.leftover_params_count = sum(p.numel() for p in module.parameters(recurse=False))


def _kernel_size(module: nn.Module | None):
    k = getattr(module, "kernel_size", None) if module is not None else None
    if isinstance(k, (tuple, list)):
        return list(k)
    if isinstance(k, int):
        return k
    return None


# ---- formatting ----------------------------------------------------------------------------------

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

    @staticmethod
    def str_(val: Any) -> str:
        return str(val) if val else "--"

    def get_start_str(self, depth: int) -> str:
        if depth == 0:
            return ""
        if depth == 1:
            return "+ " if self.ascii_only else "├─"
        return ("|    " if self.ascii_only else "│    ") * (depth - 1) + ("+ " if self.ascii_only else "└─")

    def set_layer_name_width(self, summary_list: list[LayerInfo], align_val: int = 5) -> None:
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

    def layer_info_to_row(self, info: LayerInfo, reached_max_depth: bool, total_params: int) -> str:
        values = {
            "kernel_size": self.str_(info.kernel_size),
            "groups": self.str_(info.groups),
            "input_size": self.str_(info.input_size),
            "output_size": self.str_(info.output_size),
            "num_params": info.num_params_to_str(reached_max_depth),
            "params_percent": info.params_percent(total_params, reached_max_depth),
            "mult_adds": info.macs_to_str(reached_max_depth),
            "trainable": self.str_(info.trainable),
        }
        name = info.get_layer_name(self.show_var_name, self.show_depth)
        line = self.format_row(f"{self.get_start_str(info.depth)}{name}", values)
        if self.verbose == 2:
            for inner, inner_values in info.inner_layers.items():
                line += self.format_row(f"{self.get_start_str(info.depth + 1)}{inner}", inner_values)
        return line

    def layers_to_str(self, summary_list: list[LayerInfo], total_params: int) -> str:
        out = ""
        for info in summary_list:
            if info.depth > self.max_depth or self.hide_recursive_layers and info.is_recursive:
                continue
            out += self.layer_info_to_row(info, info.depth == self.max_depth, total_params)
        return out


# ---- ModelStatistics -----------------------------------------------------------------------------

class ModelStatistics(Report):
    """torchinfo's return value, and a layerscope Report (``layers``, ``totals``, ``coverage``,
    ``table()``, ``to_csv()``, ...) when a forward ran. ``str()`` / ``print()`` give torchinfo's
    layout; the numbers are layerscope's (see the module's documentation)."""

    def __init__(self, summary_list: list[LayerInfo], input_size: Any, total_input_size: int,
                 formatting: FormattingOptions, report: Report | None = None, model: nn.Module | None = None,
                 memory_inputs: tuple | None = None) -> None:
        if report is not None:
            self.__dict__.update(report.__dict__)
        else:   # no forward: the parameter table only
            self.trace, self.layers, self.coverage, self.totals, self.graph = None, (), Coverage(), None, None
            self._model = None
        self.report = report
        self.summary_list = summary_list
        self.input_size = input_size
        self.formatting = formatting
        self.total_input = total_input_size
        if model is not None:
            # parameters as torchinfo counts them: each tensor once (tied weights counted once)
            uniq = {id(p): p for p in model.parameters()}.values()
            self.total_params = sum(p.numel() for p in uniq)
            self.trainable_params = sum(p.numel() for p in uniq if p.requires_grad)
            self.total_param_bytes = sum(p.numel() * p.element_size() for p in uniq)
        else:
            self.total_params = self.trainable_params = self.total_param_bytes = 0
        self.total_mult_adds = report.totals.macs if report is not None else 0
        self._memory_inputs = memory_inputs
        self._memory: tuple[int | None, str | None] | None = None
        self.memory_error: str | None = None   # why the step simulation could not run, if it could not
        formatting.set_layer_name_width(summary_list)

    def _forward_ran(self) -> None:
        if self.trace is None:
            raise InputError("no forward ran (summary without input_size or input_data): only the "
                             "parameter table and counts exist")

    def table(self, *args, **kwargs):
        self._forward_ran()
        return super().table(*args, **kwargs)

    def rich_table(self, *args, **kwargs):
        self._forward_ran()
        return super().rich_table(*args, **kwargs)

    def print(self, *args, **kwargs):
        self._forward_ran()
        return super().print(*args, **kwargs)

    def to_dict(self):
        self._forward_ran()
        return super().to_dict()

    def to_csv(self, *args, **kwargs):
        self._forward_ran()
        return super().to_csv(*args, **kwargs)

    def to_dataframe(self):
        self._forward_ran()
        return super().to_dataframe()

    def module(self, path: str):
        self._forward_ran()
        return super().module(path)

    @property
    def model_name(self) -> str:
        return self.trace.model_name if self.trace is not None else (
            self.summary_list[0].class_name if self.summary_list else "?")

    # the training-step figures, simulated on first use (they need a forward + backward simulation)
    def _step_memory(self) -> tuple[int | None, str | None]:
        if self._memory is None:
            self._memory = (None, None)
            model = self._model() if self._model is not None else None
            if model is not None and self._memory_inputs is not None:
                from ..api import memory
                args, kwargs, mode, input_size, dtypes, batch_dim = self._memory_inputs
                for training, basis in ((True, "forward+backward step"), (False, "forward only")):
                    try:
                        with _mode(model, mode):
                            rep = memory(model, *args, training=training, steps=1, input_size=input_size,
                                         dtypes=dtypes, batch_dim=batch_dim if input_size is not None
                                         else None, forward_kwargs=kwargs)
                    except Exception as e:   # noqa: BLE001 -- a derived figure: shown as n/a, never raised
                        self.memory_error = f"{basis}: {type(e).__name__}: {e}" if not isinstance(
                            e, LayerscopeError) else f"{basis}: {e}"
                        continue
                    self._memory = (int(rep.totals["peak_bytes"]), basis)
                    break
        return self._memory

    @property
    def memory_basis(self) -> str | None:
        """What "Estimated Total Size" simulated: "forward+backward step", "forward only" or None
        (no forward ran, or neither simulation could run)."""
        return self._step_memory()[1]

    @property
    def estimated_total_size(self) -> int | None:
        """Bytes: the simulated peak of one step (see ``memory_basis``)."""
        return self._step_memory()[0]

    @property
    def total_output_bytes(self) -> int | None:
        """torchinfo's "Forward/backward pass size", in bytes: the simulated step's peak minus the
        parameters and the inputs (activations, gradients, buffers and temporaries)."""
        peak = self.estimated_total_size
        if peak is None:
            return None
        return max(peak - self.total_param_bytes - self.total_input, 0)

    def __repr__(self) -> str:
        fmt = self.formatting
        divider = "=" * fmt.get_total_width()
        non_trainable = self.total_params - self.trainable_params
        text = (f"{divider}\n{fmt.header_row()}{divider}\n"
                f"{fmt.layers_to_str(self.summary_list, self.total_params)}{divider}\n"
                f"Total params{_num(self.total_params, auto=False)}\n"
                f"Trainable params{_num(self.trainable_params, auto=False)}\n"
                f"Non-trainable params{_num(non_trainable, auto=False)}\n")
        if self.input_size:
            out = self.total_output_bytes
            total = self.estimated_total_size
            text += (f"Total mult-adds{_num(self.total_mult_adds, auto=True)}\n{divider}\n"
                     f"Input size (MB): {self.total_input / 1e6:0.2f}\n"
                     f"Forward/backward pass size (MB): {_mb(out)}\n"
                     f"Params size (MB): {self.total_param_bytes / 1e6:0.2f}\n"
                     f"Estimated Total Size (MB): {_mb(total)}\n")
        return text + divider

    __str__ = __repr__


def _mb(n: int | None) -> str:
    return "n/a" if n is None else f"{n / 1e6:0.2f}"


def _num(n: int, auto: bool) -> str:
    """torchinfo 1.8's format_output_num: ': 1,234', or with auto units ' (M): 376.85' (T, G, else M)."""
    unit, value = "", float(n)
    if auto:
        unit, value = next(((u, n / f) for u, f in (("T", 1e12), ("G", 1e9)) if n >= f), ("M", n / 1e6))
    shown = f"{int(value):,d}" if value.is_integer() else f"{value:,.2f}"
    return f"{f' ({unit})' if unit else ''}: {shown}"


class _mode:
    """Put the model in torchinfo's mode for the step simulation and back."""

    def __init__(self, model: nn.Module, mode: str) -> None:
        self.model, self.mode = model, mode

    def __enter__(self):
        self.flags = [(m, m.training) for m in self.model.modules()]
        if self.mode != "same":
            self.model.train(self.mode == "train")

    def __exit__(self, *exc):
        for m, t in self.flags:
            m.training = t


# ---- building the summary_list ---------------------------------------------------------------------

def _number(summary_list: list[LayerInfo]) -> None:
    """torchinfo's "depth-index": a counter per depth, in call order over the whole model."""
    counters: dict[int, int] = {}
    for info in summary_list:
        counters[info.depth] = counters.get(info.depth, 0) + 1
        info.depth_index = counters[info.depth]


def layers_from_report(report: Report, model: nn.Module | None, batch_dim: int | None = None) -> list[LayerInfo]:
    """One LayerInfo per module call of a layerscope Report, in call order."""
    infos: list[LayerInfo] = []
    seen_modules: set[int] = set()
    for rec in report.layers:
        module = None
        if model is not None:
            try:
                module = model.get_submodule(rec.path)
            except AttributeError:
                module = None
        parent = infos[rec.parent] if rec.parent is not None and rec.parent < len(infos) else None
        var = rec.path.rpartition(".")[-1] if rec.path else (module._get_name() if module is not None else rec.type)
        info = LayerInfo(var, module, rec.depth, parent, class_name=None if module is not None else rec.type)
        info.record = rec
        info.executed = True
        if module is not None:
            info._fill_params(module, root=parent is None)
            if id(module) in seen_modules and info.num_params:
                info.is_recursive = True
            seen_modules.add(id(module))
        else:
            info.num_params = rec.subtree_params
            info.leftover_params_count = rec.num_params
            info.trainable_params = rec.trainable_params
            info.param_bytes = sum(p.nbytes for p in rec.params)
            info.is_leaf_layer = rec.is_leaf
            info.kernel_size = list(rec.kernel_size) if rec.kernel_size else None
        info.input_size = _size(rec.inputs, batch_dim)
        info.output_size = _size(rec.outputs, batch_dim)
        info.input_bytes = sum(t.nbytes for t in rec.inputs)
        info.output_bytes = sum(t.nbytes for t in rec.outputs)
        info.macs = rec.forward_total.macs
        info.self_macs = rec.forward.macs
        info.flops = rec.forward_total.flops
        if parent is not None:
            parent.children.append(info)
        infos.append(info)
    _number(infos)
    return infos


def _size(specs, batch_dim: int | None) -> list[int]:
    if not specs:
        return []
    shape = list(specs[0].shape)
    if batch_dim is not None and 0 <= batch_dim < len(shape):
        del shape[batch_dim]
    return shape


def layers_from_module(model: nn.Module) -> list[LayerInfo]:
    """Without a forward: the module tree, depth first, with its parameters (torchinfo's table when
    neither input_size nor input_data is given)."""
    infos: list[LayerInfo] = []
    seen: set[int] = set()

    def walk(module: nn.Module, var: str, depth: int, parent: LayerInfo | None) -> None:
        info = LayerInfo(var, module, depth, parent)
        info._fill_params(module, root=parent is None)
        if id(module) in seen and info.num_params:
            info.is_recursive = True
        seen.add(id(module))
        if parent is not None:
            parent.children.append(info)
        infos.append(info)
        for name, child in module.named_children():
            walk(child, name, depth + 1, info)

    walk(model, model._get_name(), 0, None)
    _number(infos)
    return infos


# ---- arguments -----------------------------------------------------------------------------------

def as_dtypes(dtypes) -> list[torch.dtype] | None:
    """torch.dtype values, or the legacy tensor types torchinfo's tests pass (torch.FloatTensor)."""
    if dtypes is None:
        return None
    if isinstance(dtypes, (torch.dtype, type)):
        dtypes = [dtypes]
    out = []
    for d in dtypes:
        if isinstance(d, torch.dtype):
            out.append(d)
        elif isinstance(getattr(d, "dtype", None), torch.dtype):   # torch.FloatTensor, torch.LongTensor
            out.append(d.dtype)
        else:
            raise InputError(f"dtypes takes torch dtypes (torch.float, torch.long) or tensor types "
                             f"(torch.FloatTensor), got {d!r}")
    return out


def split_input_data(input_data) -> tuple[tuple, dict]:
    """torchinfo's input_data: a tensor, a list/tuple of positional inputs, or a dict of kwargs."""
    if input_data is None:
        return (), {}
    if isinstance(input_data, torch.Tensor):
        return (input_data,), {}
    if isinstance(input_data, dict):
        return (), dict(input_data)
    if isinstance(input_data, (list, tuple)):
        return tuple(input_data), {}
    raise InputError(f"input_data must be a tensor, a list/tuple or a dict, got {type(input_data).__name__}")


def check_columns(col_names, input_given: bool) -> tuple[str, ...]:
    if col_names is None:
        return DEFAULT_COLUMN_NAMES if input_given else ("num_params",)
    if isinstance(col_names, str):
        col_names = (col_names,)
    cols = tuple(str(c) for c in col_names)
    for c in cols:
        if c not in HEADER_TITLES:
            raise InputError(f"unknown column {c!r}; torchinfo's columns are {', '.join(COLUMN_NAMES)}")
        if not input_given and c in REQUIRES_INPUT:
            raise InputError(f"column {c!r} needs input_size or input_data (a forward pass)")
    return cols


def check_rows(row_settings) -> set[str]:
    if row_settings is None:
        return {"depth"}
    if isinstance(row_settings, str):
        row_settings = (row_settings,)
    rows = {str(r) for r in row_settings}
    bad = sorted(rows - set(ROW_SETTINGS))
    if bad:
        raise InputError(f"unknown row setting {bad[0]!r}; torchinfo's row settings are {', '.join(ROW_SETTINGS)}")
    return rows


def build(model: nn.Module, input_size=None, input_data=None, batch_dim: int | None = None,
          col_names=None, col_width: int = 25, depth: int = 3, device=None, dtypes=None,
          mode: str = "same", row_settings=None, verbose: int = 1, kwargs: dict | None = None) -> ModelStatistics:
    """The ModelStatistics of one summary, without printing."""
    from ..api import analyze
    from ..capture.prepare import check_model
    check_model(model)
    kwargs = dict(kwargs or {})
    if input_size is not None and input_data is not None:
        raise InputError("give either input_size or input_data, not both")
    if mode not in ("same", "train", "eval"):
        raise InputError(f"mode must be 'train', 'eval' or 'same', got {mode!r}")
    if verbose not in (0, 1, 2):
        raise InputError(f"verbose must be 0 (quiet), 1 (default) or 2 (verbose), got {verbose!r}")
    if not isinstance(col_width, int) or col_width < 1:
        raise InputError(f"col_width must be a positive int, got {col_width!r}")
    if not isinstance(depth, int):
        raise InputError(f"depth must be an int, got {depth!r}")
    given = input_size is not None or input_data is not None
    cols = check_columns(col_names, given)
    rows = check_rows(row_settings)
    formatting = FormattingOptions(sys.maxsize if depth < 0 else depth, verbose, cols, col_width, rows)
    if not given:
        if kwargs:
            raise InputError(f"forward arguments {', '.join(sorted(kwargs))} were given without "
                             "input_size or input_data")
        return ModelStatistics(layers_from_module(model), [], 0, formatting, model=model)
    args, data_kwargs = split_input_data(input_data)
    kwargs = {**data_kwargs, **kwargs}
    # with input_data, batch_dim only takes that dimension out of the sizes shown (as torchinfo)
    rep = analyze(model, *args, input_size=input_size, dtypes=as_dtypes(dtypes),
                  batch_dim=batch_dim if input_size is not None else None, device=device, mode=mode,
                  forward_kwargs=kwargs)
    if input_size is not None:
        from ..capture.inputs import make_inputs
        sizes = [list(t.shape) for t in make_inputs(input_size, as_dtypes(dtypes), batch_dim, torch.device("meta"))]
    else:
        from ..capture import iter_tensors
        sizes = [list(t.shape) for t in iter_tensors((args, data_kwargs))]
    infos = layers_from_report(rep, model, batch_dim)
    return ModelStatistics(infos, sizes, rep.totals.input_bytes, formatting, report=rep, model=model,
                           memory_inputs=(args, kwargs, mode, input_size, as_dtypes(dtypes), batch_dim))


def summary(model: nn.Module, input_size=None, input_data=None, batch_dim: int | None = None,
            cache_forward_pass: bool | None = None, col_names: Iterable[str] | None = None,
            col_width: int = 25, depth: int = 3, device=None, dtypes=None, mode: str = "same",
            row_settings: Iterable[str] | None = None, verbose: int | None = None,
            **kwargs: Any) -> ModelStatistics:
    """torchinfo.summary with layerscope's numbers: prints torchinfo's table (verbose 1 or 2) and
    returns a ModelStatistics. Other keyword arguments go to ``model.forward``. See the module's
    documentation for where the numbers differ from torchinfo's and why."""
    del cache_forward_pass   # accepted for torchinfo's callers; every call runs (no global cache)
    if verbose is None:
        verbose = 0 if getattr(sys, "ps1", None) else 1
    stats = build(model, input_size, input_data, batch_dim, col_names, col_width, depth, device, dtypes,
                  mode, row_settings, verbose, kwargs)
    if verbose:
        print(stats)
    return stats


# ``layerscope.summary`` (re-exported by the package): here, above api, so that api never imports
# the front ends.
def layerscope_summary(model: nn.Module, input_size=None, input_data=None, batch_dim: int | None = None,
            col_names: Iterable[str] | None = None, depth: int = 3, device=None, dtypes=None,
            mode: str = "eval", verbose: int = 1, *, col_width: int = 25, row_settings=None,
            cache_forward_pass: bool | None = None, receptive_field: bool = False, **kwargs: Any):
    """torchinfo.summary's arguments: prints layerscope's table (verbose 1; 2 shows every repeated
    block unfolded) and returns a ``compat.torchinfo.ModelStatistics``: a Report with torchinfo's
    attributes (total_params, total_mult_adds, summary_list, ...) whose ``str()`` is torchinfo's
    layout with these ``col_names``, ``depth`` (-1: every depth), ``col_width`` and ``row_settings``.
    Without inputs, the parameter table. ``input_data``: a tensor, a list/tuple of positional inputs
    or a dict of kwargs; other kwargs go to ``forward``. ``receptive_field`` adds that column to the
    printed table (torchscan's argument); ``cache_forward_pass`` is accepted and ignored. For
    torchinfo's printed layout too, import ``layerscope.compat.torchinfo.summary``."""
    from ..reports.summary import COLUMNS, DEFAULT_COLUMNS
    del cache_forward_pass
    known = {c.key for c in COLUMNS} | {a for c in COLUMNS for a in c.aliases}
    cols = col_names.split(",") if isinstance(col_names, str) else col_names
    for c in cols or ():
        if c not in COLUMN_NAMES and c not in known:
            raise InputError(f"unknown column {c!r}; choose from "
                             f"{', '.join((*(c.key for c in COLUMNS), *COLUMN_NAMES))}")
    # layerscope's own column names (flops, receptive_field, ...) are for the printed table only
    ti_cols = None if cols is None else [c for c in cols if c in COLUMN_NAMES] or None
    stats = build(model, input_size, input_data, batch_dim, ti_cols, col_width, depth, device, dtypes,
                  mode, row_settings, verbose, kwargs)
    if verbose:
        if stats.report is None:
            print(stats)
        else:
            # torchinfo's groups and params_percent have no layerscope column: str(stats) shows them
            shown = None if cols is None else [c for c in cols if c not in COLUMN_NAMES or c in known] or None
            if receptive_field:
                shown = [*(shown or DEFAULT_COLUMNS), "receptive_field"]
            stats.report.print(depth=None if depth < 0 else depth, columns=shown, fold=verbose < 2)
    return stats
