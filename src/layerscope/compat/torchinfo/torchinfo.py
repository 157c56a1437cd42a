"""torchinfo's ``torchinfo.torchinfo``: ``summary()`` and the ``ModelStatistics`` it returns, with
layerscope's numbers (the package's documentation says where they differ from torchinfo's)."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterable, Mapping

import torch
from torch import nn

from ...capture.records import param_totals
from ...errors import InputError, LayerscopeError
from ...render.torchinfo import HEADER_TITLES, FormattingOptions, statistics_text
from ...render.units import TORCHINFO_UNITS, torchinfo_number
from ...reports.summary import Report
from ...trace import Coverage
from .enums import Units
from .layer_info import LayerInfo, layers_from_module, layers_from_report, pruned_totals
from .output_shapes import PeerShapes

__all__ = ["summary", "layerscope_summary", "ModelStatistics", "LayerInfo", "FormattingOptions", "COLUMN_NAMES",
           "ROW_SETTINGS", "clear_cached_forward_pass"]

COLUMN_NAMES = tuple(HEADER_TITLES)
ROW_SETTINGS = ("depth", "var_names", "ascii_only", "hide_recursive_layers")
DEFAULT_COLUMN_NAMES = ("output_size", "num_params")
REQUIRES_INPUT = {"input_size", "output_size", "mult_adds"}


# ---- ModelStatistics -----------------------------------------------------------------------------

def parameter_totals(report: Report | None, model: nn.Module | None, counts: dict | None = None
                     ) -> tuple[int, int, int]:
    """(params, trainable params, param bytes): the Report's totals where a forward ran, else the same
    sums over the model's distinct tensors (``capture.records.param_totals``); zeros without either.
    Elements a pruning mask zeroes are left out, as torchinfo counts them (``layer_info.pruned_away``)."""
    if report is not None:
        t = report.totals
        totals = (t.params, t.trainable_params, t.param_bytes)
    else:
        totals = param_totals(model) if model is not None else (0, 0, 0)
    if model is None:
        return totals
    return tuple(a - b for a, b in zip(totals, pruned_totals(model, counts)))



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
        self.input_shapes: list = []          # each input tensor's shape (the batch included)
        self.formatting = formatting
        self.total_input = total_input_size
        # parameters as torchinfo counts them: each tensor once (tied weights counted once)
        rows = summary_list[0]._rows if summary_list else None     # its parameter counts, made once
        self.total_params, self.trainable_params, self.total_param_bytes = parameter_totals(
            report, model, rows.counts if rows is not None and model is not None else None)
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
                from ...api import memory
                args, kwargs, mode, input_size, dtypes, batch_dim = self._memory_inputs
                from ...capture.shadow import shadow_of
                work = shadow_of(model)   # the mode set on a copy: another thread's model keeps its own
                for training, basis in ((True, "forward+backward step"), (False, "forward only")):
                    try:
                        with _mode(work, mode):
                            rep = memory(work, *args, training=training, steps=1, input_size=input_size,
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
        return statistics_text(self)

    __str__ = __repr__

    # torchinfo's static helpers
    @staticmethod
    def float_to_megabytes(num: int) -> float:
        """``num`` float32 values in megabytes (4 bytes each, 1e6 bytes a megabyte)."""
        return num * 4 / 1e6

    @staticmethod
    def to_megabytes(num: int) -> float:
        return num / 1e6

    @staticmethod
    def to_readable(num: int, units: str = "auto") -> tuple[Units, float]:
        """(the unit, ``num`` in it): "auto" picks T, G or else M, as the printed totals do."""
        units = Units(str.__str__(units))
        if units is Units.AUTO:
            units = next((Units(u) for u, f in TORCHINFO_UNITS.items() if num >= f and u != "M"), Units.MEGABYTES)
        return units, num / TORCHINFO_UNITS.get(units.value, 1)

    @staticmethod
    def format_output_num(num: int, units: str) -> str:
        return torchinfo_number(num, units=units)


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
    if isinstance(input_data, torch.Tensor) or _is_array(input_data):     # a NumPy array: passed as it is
        return (input_data,), {}
    if isinstance(input_data, dict):
        return (), dict(input_data)
    if isinstance(input_data, (list, tuple)):
        return tuple(input_data), {}
    raise InputError(f"input_data must be a tensor, a NumPy array, a list/tuple or a dict, got "
                     f"{type(input_data).__name__}")


def _is_array(x) -> bool:
    return hasattr(x, "__array__") and hasattr(x, "shape") and not isinstance(x, (str, bytes))


def _name(v) -> str:
    """An option as its string: torchinfo's enum members (ColumnSettings.NUM_PARAMS) by their value."""
    return str.__str__(v) if isinstance(v, str) else str(v)


def check_columns(col_names, input_given: bool) -> tuple[str, ...]:
    if col_names is None:
        return DEFAULT_COLUMN_NAMES if input_given else ("num_params",)
    if isinstance(col_names, str):
        col_names = (col_names,)
    cols = tuple(_name(c) for c in col_names)
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
    rows = {_name(r) for r in row_settings}
    bad = sorted(rows - set(ROW_SETTINGS))
    if bad:
        raise InputError(f"unknown row setting {bad[0]!r}; torchinfo's row settings are {', '.join(ROW_SETTINGS)}")
    return rows


def build(model: nn.Module, input_size=None, input_data=None, batch_dim: int | None = None,
          col_names=None, col_width: int = 25, depth: int = 3, device=None, dtypes=None,
          mode: str = "same", row_settings=None, verbose: int = 1, kwargs: dict | None = None,
          peer_shapes: bool = False) -> ModelStatistics:
    """The ModelStatistics of one summary, without printing. ``peer_shapes``: torchinfo's Output Shape
    for each call (``output_shapes.peer_size``: its reduction of a dict, tuple or array output to one
    shape), and its RuntimeError for a layer whose output it has no shape for (a string, a class);
    else the first output tensor's shape as it ran, whatever the layer returned."""
    from ...api import analyze
    from ...capture.prepare import check_model
    check_model(model)
    kwargs = dict(kwargs or {})
    if input_size is not None and input_data is not None:
        raise _RuntimeInputError("give either input_size or input_data, not both")
    if device is not None and not isinstance(device, torch.device):
        try:
            torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise _RuntimeInputError(f"device {device!r} is not a torch device: {e}") from None
    if input_size is not None and not isinstance(input_size, (list, tuple)):
        raise _TypeInputError(f"input_size must be a shape like (1, 3, 224, 224) or a list of shapes, got "
                              f"{type(input_size).__name__} {input_size!r}")
    mode = "eval" if mode is None else _name(mode)         # torchinfo 1.8's default: eval
    if mode not in ("same", "train", "eval"):
        raise InputError(f"mode must be 'train', 'eval' or 'same', got {mode!r}")
    if verbose not in (0, 1, 2):
        raise InputError(f"verbose must be 0 (quiet), 1 (default) or 2 (verbose), got {verbose!r}")
    if not isinstance(col_width, int) or col_width < 1:
        raise InputError(f"col_width must be a positive int, got {col_width!r}")
    if not isinstance(depth, int):
        raise InputError(f"depth must be an int, got {depth!r}")
    if batch_dim is not None and not isinstance(batch_dim, int):
        raise InputError(f"batch_dim must be an int or None, got {batch_dim!r}")
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
    # with input_data, batch_dim builds nothing (its tensors have their batch); torchinfo's shapes of
    # structures (PeerShapes) still set that entry to 1
    # the hooks go on a copy of the module tree (capture/shadow.py): another thread calling the model
    # meanwhile meets none of them (issue 58); the shapes are noted by the user's modules
    from ...capture.shadow import shadow_of
    work = shadow_of(model)
    shapes = PeerShapes(work, batch_dim) if peer_shapes else None
    with shapes if shapes is not None else contextlib.nullcontext():
        rep = analyze(work, *args, input_size=input_size, dtypes=as_dtypes(dtypes),
                      batch_dim=batch_dim if input_size is not None else None, device=device, mode=mode,
                      forward_kwargs=kwargs)
    if shapes is not None and shapes.unsized is not None:
        path, what = shapes.unsized
        raise _RuntimeInputError(f"layer {path} returned {what}: torchinfo's summary shows a layer's output "
                                 "only if it is a tensor, a NumPy array, a list, a tuple, a dict or None")
    if input_size is not None:
        from ...capture.inputs import make_inputs
        sizes = [list(t.shape) for t in make_inputs(input_size, as_dtypes(dtypes), batch_dim, torch.device("meta"))]
    else:
        from ...capture import iter_tensors
        sizes = [list(t.shape) for t in iter_tensors((args, data_kwargs))]
    infos = layers_from_report(rep, model, batch_dim, shapes)
    stats = ModelStatistics(infos, given_sizes(input_size) if input_size is not None else data_sizes(input_data),
                            rep.totals.input_bytes, formatting, report=rep, model=model,
                            memory_inputs=(args, kwargs, mode, input_size, as_dtypes(dtypes), batch_dim))
    stats.input_shapes = sizes
    return stats


def given_sizes(input_size) -> list:
    """torchinfo's ``input_size`` attribute for an ``input_size`` argument: a list of the sizes (one
    size, a list of them or a tuple of tuples), as given."""
    if isinstance(input_size, list) and input_size and isinstance(input_size[0], int):
        return [tuple(input_size)]
    if isinstance(input_size, list):
        return input_size
    if isinstance(input_size, tuple) and input_size and isinstance(input_size[0], (tuple, list)):
        return list(input_size)
    return [input_size]


def data_sizes(data):
    """torchinfo's ``input_size`` attribute for ``input_data``: the same structure, each tensor (or
    NumPy array) replaced by its torch.Size."""
    if isinstance(data, torch.Tensor):
        return data.size()
    if _is_array(data):
        return torch.Size(data.shape)
    if isinstance(data, Mapping):
        return type(data)({k: data_sizes(v) for k, v in data.items()})
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(data_sizes(v) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(data_sizes(v) for v in data)
    return data


def summary(model: nn.Module, input_size=None, input_data=None, batch_dim: int | None = None,
            cache_forward_pass: bool | None = None, col_names: Iterable[str] | None = None,
            col_width: int = 25, depth: int = 3, device=None, dtypes=None, mode: str | None = None,
            row_settings: Iterable[str] | None = None, verbose: int | None = None,
            **kwargs: Any) -> ModelStatistics:
    """torchinfo.summary with layerscope's numbers: prints torchinfo's table (verbose 1 or 2) and
    returns a ModelStatistics. Other keyword arguments go to ``model.forward``. See the module's
    documentation for where the numbers differ from torchinfo's and why."""
    del cache_forward_pass   # accepted for torchinfo's callers; every call runs (no global cache)
    if verbose is None:
        verbose = 0 if getattr(sys, "ps1", None) else 1
    stats = build(model, input_size, input_data, batch_dim, col_names, col_width, depth, device, dtypes,
                  mode, row_settings, verbose, kwargs, peer_shapes=True)
    if verbose:
        print(stats)
    return stats


class _RuntimeInputError(InputError, RuntimeError):
    """Bad input where torchinfo raises RuntimeError (its callers catch that)."""


class _TypeInputError(InputError, TypeError):
    """Bad input where torchinfo raises TypeError."""


def clear_cached_forward_pass() -> None:
    """torchinfo's cache of forward passes (``cache_forward_pass=True``): layerscope keeps none, so
    there is nothing to clear."""


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
    from ...reports.summary import COLUMNS, DEFAULT_COLUMNS
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
