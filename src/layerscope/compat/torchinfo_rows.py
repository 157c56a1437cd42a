"""torchinfo's rows: one ``LayerInfo`` per module call, from a layerscope Report or, without a
forward, from the module tree (torchinfo's ``summary_list``). How they are drawn is
``layerscope.render.torchinfo``'s job."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

if TYPE_CHECKING:
    from ..reports.summary import Report

__all__ = ["LayerInfo", "layers_from_report", "layers_from_module"]


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


# ---- building the summary_list ---------------------------------------------------------------------

def _number(summary_list: list[LayerInfo]) -> None:
    """torchinfo's "depth-index": a counter per depth, in call order over the whole model."""
    counters: dict[int, int] = {}
    for info in summary_list:
        counters[info.depth] = counters.get(info.depth, 0) + 1
        info.depth_index = counters[info.depth]


def layers_from_report(report: "Report", model: nn.Module | None, batch_dim: int | None = None) -> list[LayerInfo]:
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
