"""torchModelSummary's ``Statistics`` (github.com/DaunKimY/torchModelSummary) with layerscope's numbers.

    from layerscope.compat.modelsummary import Statistics       # was: from modelSummary import Statistics
    stats = Statistics(model=model, input_data=torch.rand(1, 3, 224, 224))
    stats.summary_list          # [Conv2d: 1-1, BatchNorm2d: 1-2, ...]: one entry per module call
    stats.summary_list[0].module, .output_size, .num_params, .macs, .size_bytes
    print(stats)

Same constructor (``Statistics(model, input_data=None, *args, batch_dim=0, branching=True,
depth=None, device=None, dtypes=None, **kwargs)``: ``input_data`` is tensors, or sizes without the
batch dimension, to which a batch of 2 is added at ``batch_dim``), the same attributes and the same
units: byte figures are MB of 1024**2 bytes. The numbers are layerscope's (docs/compat.md): MACs of
the ops that ran; a layer's ``input_bytes`` / ``output_bytes`` / ``params_bytes`` are that call's own
tensors at their real dtypes (torchModelSummary: element counts x 4, and every layer's input_bytes
is the whole model's input); ``size_bytes`` their sum; ``total_output_bytes`` is the simulated
forward + backward step's peak minus parameters and inputs (its heuristic: 2 x outputs of layers
with parameters) and ``total_size_bytes`` the simulated peak itself.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..errors import InputError
from ..render.modelsummary import Totals, layer_line, statistics_text
from .torchinfo import torchinfo as _ti

__all__ = ["Statistics", "LayerInfo"]

_MB = 1024 ** 2


class LayerInfo:
    """One module call (torchModelSummary's LayerInfo attributes). Byte figures in MB (1024**2)."""

    def __init__(self, info: _ti.LayerInfo, parent: "LayerInfo | None") -> None:
        rec = info.record
        self.layer_id = info.layer_id
        self.module = info.module
        self.class_name = info.class_name
        self.inner_layers = info.inner_layers
        self.depth = info.depth
        self.depth_index = info.depth_index
        self.executed = info.executed
        self.parent_info = parent
        self.trainable = info.trainable_params > 0
        self.is_recursive = info.is_recursive
        self.input_size = info.input_size
        self.output_size = info.output_size
        self.kernel_size = info.kernel_size
        self.num_params = info.num_params
        self.macs = info.macs
        self.input_bytes = info.input_bytes / _MB
        self.output_bytes = info.output_bytes / _MB
        self.params_bytes = info.param_bytes / _MB
        self.size_bytes = self.input_bytes + self.output_bytes + self.params_bytes
        self.record = rec

    def __repr__(self) -> str:
        return f"{self.class_name}: {self.depth}-{self.depth_index}"

    def __str__(self) -> str:
        return layer_line(self.class_name, self.depth, self.depth_index, self.input_size, self.output_size,
                          self.num_params, self.input_bytes, self.output_bytes, self.params_bytes, self.size_bytes)


def _depth(model: nn.Module, depth: int = 1, current: int = 1) -> int:
    """torchModelSummary's get_depth: the deepest nesting of modules with children."""
    for layer in model.children():
        if any(layer.children()):
            depth = _depth(layer, depth, current + 1)
    return current if current > depth else depth


class Statistics:
    """torchModelSummary's Statistics over ``layerscope.analyze`` (see the module's documentation)."""

    def __init__(self, model: nn.Module, input_data: Any = None, *args: Any, batch_dim: int | None = 0,
                 branching: bool = True, depth: int | None = None, device=None, dtypes=None, **kwargs: Any):
        from ..capture.prepare import check_model
        check_model(model)
        del branching, depth        # layout switch and an unused argument of the original
        self.depth = _depth(model)
        self.input_size: list = []
        self.total_input = 0
        self.total_output: float = 0
        self.summary_list: list[LayerInfo] = []
        if input_data is None:
            infos = _ti.layers_from_module(model)[1:]
            for i in infos:
                i.record = None
            self._stats = None
        else:
            input_size = None
            data = None
            if isinstance(input_data, torch.Tensor):
                data = [input_data]
            elif isinstance(input_data, (list, tuple)) and input_data and all(
                    isinstance(t, torch.Tensor) for t in input_data):
                data = list(input_data)
            elif isinstance(input_data, (list, tuple, torch.Size)):
                sizes = [input_data] if all(isinstance(d, int) for d in input_data) else list(input_data)
                if batch_dim is not None:
                    sizes = [(*s[:batch_dim], 2, *s[batch_dim:]) for s in (tuple(x) for x in sizes)]
                input_size = sizes
            else:
                raise InputError(f"input_data must be tensors or sizes, got {type(input_data).__name__}")
            if input_size is not None and args:
                raise InputError("extra positional inputs need input_data as tensors, not sizes")
            tensors = None if input_size is not None else [*data, *args]
            self._stats = _ti.build(model, input_size=input_size, input_data=tensors, device=device,
                                    dtypes=dtypes, mode="eval", verbose=0, depth=-1, kwargs=kwargs)
            infos = self._stats.summary_list[1:]     # torchModelSummary lists the submodules only
            self.input_size = self._stats.input_shapes
            self.total_input = sum(int(torch.Size(s).numel()) for s in self.input_size)
        by_id: dict[int, LayerInfo] = {}
        for i in infos:
            parent = by_id.get(id(i.parent_info)) if i.parent_info is not None else None
            li = LayerInfo(i, parent)
            by_id[id(i)] = li
            self.summary_list.append(li)
        # the Report's totals where a forward ran, else the same sums over the model (one definition)
        self.total_params, self.trainable_params, param_bytes = (
            _ti.parameter_totals(self._stats.report if self._stats is not None else None, model))
        self.total_mult_adds = self._stats.total_mult_adds if self._stats is not None else 0
        self.total_input_bytes = (self._stats.total_input / _MB) if self._stats is not None else 0.0
        self.total_params_bytes = param_bytes / _MB
        self.total_output_bytes = 0.0
        self.total_size_bytes = self.total_input_bytes + self.total_params_bytes
        if self._stats is not None:
            out = self._stats.total_output_bytes
            if out is not None:
                self.total_output_bytes = out / _MB
                self.total_output = out / 4          # torchModelSummary's unit: fp32 elements
                self.total_size_bytes = self._stats.estimated_total_size / _MB

    @property
    def report(self):
        """The layerscope Report underneath (None without input_data)."""
        return self._stats.report if self._stats is not None else None

    def __repr__(self) -> str:
        totals = Totals(params=self.total_params, trainable=self.trainable_params, mult_adds=self.total_mult_adds,
                        input_mb=self.total_input_bytes, output_mb=self.total_output_bytes,
                        params_mb=self.total_params_bytes, size_mb=self.total_size_bytes,
                        with_input=bool(self.input_size))
        return statistics_text([str(i) for i in self.summary_list], totals)
