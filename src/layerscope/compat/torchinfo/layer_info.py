"""torchinfo's rows: one ``LayerInfo`` per module call, from a layerscope Report or, without a
forward, from the module tree (torchinfo's ``summary_list``). How they are drawn is
``layerscope.render.torchinfo``'s job; the Output Shape torchinfo gives a call is output_shapes.py's."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from ...reports.summary import Report
    from .output_shapes import PeerShapes

__all__ = ["LayerInfo", "layers_from_report", "layers_from_module", "param_counts", "pruned_away", "pruned_totals"]


# ---- LayerInfo -----------------------------------------------------------------------------------

def _class_name(module: nn.Module) -> str:
    """The module's class name; a scripted module's is its original class's (``original_name``)."""
    if isinstance(module, torch.jit.ScriptModule):
        return getattr(module, "original_name", None) or module._get_name()
    return module._get_name()


class LayerInfo:
    """One row of torchinfo's ``summary_list``: one call of one module (torchinfo's LayerInfo
    attributes, plus torchModelSummary's ``input_bytes``, ``params_bytes`` and ``size_bytes``)."""

    def __init__(self, var_name: str, module: nn.Module | None, depth: int,
                 parent_info: "LayerInfo | None" = None, class_name: str | None = None) -> None:
        self.layer_id = id(module) if module is not None else None
        self.module = module
        self.class_name = class_name or (_class_name(module) if module is not None else "?")
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
        self.record = None       # the layerscope LayerRecord behind this row (None without a forward)
        self.path = ""           # the module's dotted path in the model
        self.call_parent: LayerInfo | None = None   # the row of the call that made this one
        self._rows: _Rows | None = None             # the table this row belongs to

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
        """torchinfo's leftover: its subtree's parameters not on its descendants' rows (a leaf's, a
        container's leftover; repeats not again). The printed column uses ``shown_params``, which
        also adds up where calls interleave or modules are shared."""
        return self.num_params - sum(c.num_params if c.is_leaf_layer else c.leftover_params()
                                     for c in self._descendants() if not c.is_recursive)

    def _descendants(self):
        for c in self.children:
            yield c
            yield from c._descendants()

    def shown_params(self, max_depth: int) -> tuple[int, int]:
        """(parameters, trainable ones) this row shows when the table goes down to ``max_depth``: each
        distinct parameter once, on the first of the deepest rows shown that hold it (``_Rows``), so
        the column adds up to the total whatever the calls' order, sharing or containers."""
        rows = self._rows
        return rows.shown(max_depth).get(id(self), (0, 0)) if rows is not None else (0, 0)

    def num_params_to_str(self, reached_max_depth: bool, max_depth: int | None = None) -> str:
        if self.num_params == 0:
            return "--"
        if max_depth is not None and self._rows is not None:
            n, trainable = self.shown_params(max_depth)
            if n == 0:
                return "(recursive)" if self.is_recursive else "--"
            return f"{n:,}" if trainable or not (reached_max_depth or self.is_leaf_layer) else f"({n:,})"
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

    def params_percent(self, total_params: int, reached_max_depth: bool, precision: int = 2,
                       max_depth: int | None = None) -> str:
        spacing = 5
        zero = f"{' ' * spacing}--"
        if total_params == 0:
            return zero
        if max_depth is not None and self._rows is not None:
            params = self.shown_params(max_depth)[0]
            if params == 0 and self.is_recursive and self.num_params:
                return "(recursive)"
        elif self.is_recursive:
            return "(recursive)"
        else:
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
            if isinstance(p, nn.parameter.UninitializedParameter):
                continue            # a lazy module's before its first forward: no elements yet (as torchinfo)
            n = p.numel() - pruned_away(module, name, p)
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


def pruned_away(module: nn.Module, name: str, p: torch.Tensor) -> int:
    """Elements of parameter ``name`` that a pruning mask zeroes (torch.nn.utils.prune keeps the weight as
    ``weight_orig`` beside a 0/1 ``weight_mask`` and recomputes the weight in a forward pre-hook):
    torchinfo counts a pruned parameter as its mask's ones. 0 when no pruning hook of torch's
    recomputes that weight (an ``x_orig`` and an ``x_mask`` of the user's own are plain tensors), or
    the mask has no values (meta)."""
    path, _, attr = name.rpartition(".")
    if not attr.endswith("_orig"):
        return 0
    try:
        owner = module.get_submodule(path) if path else module
    except (AttributeError, RuntimeError):
        return 0
    from torch.nn.utils.prune import BasePruningMethod
    base = attr[:-len("_orig")]
    if not any(isinstance(h, BasePruningMethod) and getattr(h, "_tensor_name", None) == base
               for h in owner._forward_pre_hooks.values()):
        return 0
    mask = getattr(owner, base + "_mask", None)
    if not isinstance(mask, torch.Tensor) or mask.shape != p.shape or mask.is_meta:
        return 0
    return p.numel() - int(torch.count_nonzero(mask))


def pruned_totals(model: nn.Module, counts: dict | None = None) -> tuple[int, int, int]:
    """(elements, trainable elements, bytes) that pruning masks zero across the model's distinct
    parameters (``param_counts``, or ``counts`` already made from it: a mask on any module holding a
    parameter applies)."""
    counts = param_counts(model) if counts is None else counts
    n = trainable = nbytes = 0
    for p in model.parameters():
        if id(p) not in counts:
            continue
        k = p.numel() - counts[id(p)][0]
        n += k
        nbytes += k * p.element_size()
        if p.requires_grad:
            trainable += k
    return n, trainable, nbytes


def _kernel_size(module: nn.Module | None):
    k = getattr(module, "kernel_size", None) if module is not None else None
    if isinstance(k, (tuple, list)):
        return list(k)
    if isinstance(k, int):
        return k
    return None


# ---- building the summary_list ---------------------------------------------------------------------

class _Rows:
    """One table's rows and its parameters: which row shows which parameter at a given depth."""

    def __init__(self, rows: list[LayerInfo], model: nn.Module | None) -> None:
        self.rows = rows
        self.counts = param_counts(model) if model is not None else {}
        self.held: dict[int, set[int]] = {}
        for r in rows:
            r._rows = self
            if r.module is not None:
                self.held[id(r)] = {id(p) for p in r.module.parameters() if id(p) in self.counts}
        self._cache: dict[int, dict[int, tuple[int, int]]] = {}

    def shown(self, max_depth: int) -> dict[int, tuple[int, int]]:
        if max_depth not in self._cache:
            owner: dict[int, LayerInfo] = {}
            for r in self.rows:           # in order: the first of the deepest rows shown that hold it
                if r.depth > max_depth:
                    continue
                for pid in self.held.get(id(r), ()):
                    o = owner.get(pid)
                    if o is None or r.depth > o.depth:
                        owner[pid] = r
            out: dict[int, tuple[int, int]] = {}
            for pid, r in owner.items():
                n, trainable = self.counts[pid][:2]
                a, b = out.get(id(r), (0, 0))
                out[id(r)] = (a + n, b + trainable)
            self._cache[max_depth] = out
        return self._cache[max_depth]


def param_counts(model: nn.Module) -> dict[int, tuple[int, int, int]]:
    """Each distinct parameter's (elements, trainable elements, bytes) as torchinfo counts them: a
    pruned one (a mask on any module holding it) as its mask's ones; an uninitialized one left out."""
    out: dict[int, tuple[int, int, int]] = {}
    for _, m in model.named_modules(remove_duplicate=False):
        for name, p in m.named_parameters(recurse=False):
            if isinstance(p, nn.parameter.UninitializedParameter):
                continue
            n = p.numel() - pruned_away(m, name, p)
            old = out.get(id(p))
            if old is None or n < old[0]:
                out[id(p)] = (n, n if p.requires_grad else 0, n * p.element_size())
    return out


def _number(summary_list: list[LayerInfo]) -> None:
    """torchinfo's "depth-index": a counter per depth, in call order over the whole model."""
    counters: dict[int, int] = {}
    for info in summary_list:
        counters[info.depth] = counters.get(info.depth, 0) + 1
        info.depth_index = counters[info.depth]


def layers_from_report(report: "Report", model: nn.Module | None, batch_dim: int | None = None,
                       shapes: "PeerShapes | None" = None) -> list[LayerInfo]:
    """One LayerInfo per module call of a layerscope Report, in call order. ``shapes``: torchinfo's
    output shapes of the calls, noted while the report's forward ran (a call it has none for, e.g.
    inside TorchScript, shows the first output tensor's shape as it ran)."""
    infos: list[LayerInfo] = []
    # by path from named_modules (ScriptModules have no get_submodule)
    modules = dict(model.named_modules(remove_duplicate=False)) if model is not None else {}
    for rec in report.layers:
        module = modules.get(rec.path)
        parent = infos[rec.parent] if rec.parent is not None and rec.parent < len(infos) else None
        var = rec.path.rpartition(".")[-1] if rec.path else (_class_name(module) if module is not None else rec.type)
        info = LayerInfo(var, module, rec.depth, parent, class_name=None if module is not None else rec.type)
        info.record = rec
        info.path = rec.path
        info.executed = True
        if module is not None:
            info._fill_params(module, root=parent is None)
        else:
            info.num_params = rec.subtree_params
            info.trainable_params = rec.trainable_params
            info.param_bytes = sum(p.nbytes for p in rec.params)
            info.is_leaf_layer = rec.is_leaf
            info.kernel_size = list(rec.kernel_size) if rec.kernel_size else None
        info.input_size = _size(rec.inputs, batch_dim)
        shown = shapes.get(module, rec.call_index) if shapes is not None and module is not None else None
        info.output_size = shown if shown is not None else _size(rec.outputs, batch_dim)
        info.input_bytes = sum(t.nbytes for t in rec.inputs)
        info.output_bytes = sum(t.nbytes for t in rec.outputs)
        info.macs = rec.forward_total.macs
        info.self_macs = rec.forward.macs
        info.flops = rec.forward_total.flops
        infos.append(info)
    infos = _with_containers(infos, modules)
    _number(infos)
    _Rows(infos, model)
    return infos


def _with_containers(infos: list[LayerInfo], modules: dict[str, nn.Module]) -> list[LayerInfo]:
    """The rows with torchinfo's rows for containers that never ran themselves (a ModuleList, a
    ModuleDict): a module called by an ancestor further up its tree than its parent (a block of a
    ModuleList called by the model) sits under a row for each module between them, at its depth in
    the tree, as torchinfo lists it; such a row opens once per run of its members, and again (as a
    repeat) when its members are called again later. Each row's children are then the rows under
    it; a row is a repeat when its module had a row before (inserted or called); its MACs at the
    depth limit are those of the calls under it made from outside it."""
    out: list[LayerInfo] = []
    current: dict[int, LayerInfo] = {}     # the last row at each depth
    for info in infos:
        parent = info.parent_info
        path = info.record.path if info.record is not None else ""
        base = parent.record.path if parent is not None and parent.record is not None else ""
        between: list[str] = []
        if parent is not None and (not base or path.startswith(base + ".")):
            rest = path[len(base) + 1:] if base else path
            parts = rest.split(".")
            between = [".".join(filter(None, [base, *parts[:i]])) for i in range(1, len(parts))]
        depth = parent.depth + 1 if parent is not None else 0
        for anc in between:
            row = current.get(depth)
            if row is None or row.path != anc:      # its last row at this depth is not that module's
                module = modules.get(anc)
                row = LayerInfo(anc.rpartition(".")[-1], module, depth, parent)
                row.path = anc
                if module is not None:
                    row._fill_params(module, root=False)
                out.append(row)
                if parent is not None:
                    parent.children.append(row)
                current[depth] = row
                for d in [d for d in current if d > depth]:
                    del current[d]
            parent, depth = row, depth + 1
        info.call_parent = info.parent_info
        info.parent_info, info.depth = parent, depth
        if parent is not None:
            parent.children.append(info)
        out.append(info)
        current[depth] = info
        for d in [d for d in current if d > depth]:
            del current[d]
    seen_ids: set[int] = set()
    for row in out:               # a repeat: its module had a row before (inserted or called)
        if row.module is not None:
            row.is_recursive = id(row.module) in seen_ids
            seen_ids.add(id(row.module))
    for row in out:
        # at the depth limit a row shows the MACs of the calls under it made from outside it (each
        # call's MACs include those it made itself): every call is counted once at each depth
        under = list(row._descendants())
        inside = {id(row)} | {id(c) for c in under}
        row.macs = sum(x.record.forward_total.macs for x in [row, *under]
                       if x.record is not None and (x is row or id(x.call_parent) not in inside))
    return out


def _size(specs, batch_dim: int | None) -> list[int]:
    """The first tensor's shape as it ran, the batch dimension included (torchinfo 1.8 prints the batch
    of 1 that ``input_size`` with ``batch_dim`` inserts, and input_data's own batch)."""
    del batch_dim
    return list(specs[0].shape) if specs else []


def layers_from_module(model: nn.Module) -> list[LayerInfo]:
    """Without a forward: the module tree, depth first, with its parameters (torchinfo's table when
    neither input_size nor input_data is given)."""
    infos: list[LayerInfo] = []
    seen: set[int] = set()

    def walk(module: nn.Module, var: str, depth: int, parent: LayerInfo | None) -> None:
        info = LayerInfo(var, module, depth, parent)
        info._fill_params(module, root=parent is None)
        if id(module) in seen:
            info.is_recursive = True
        seen.add(id(module))
        if parent is not None:
            parent.children.append(info)
        infos.append(info)
        for name, child in module._modules.items():     # a child held twice: a row each (as torchinfo)
            if child is not None:
                walk(child, name, depth + 1, info)

    walk(model, _class_name(model), 0, None)
    _number(infos)
    _Rows(infos, model)
    return infos
