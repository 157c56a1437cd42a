"""torchinfo's Output Shape of a module call: its reduction of what the call returned to one shape
(``peer_size``), noted by a forward hook on each module while the report's forward runs (``PeerShapes``);
layer_info.py puts them on the rows."""

from __future__ import annotations

import reprlib
import sys
import threading
from typing import Any

import torch
from torch import nn

from ...capture import hooks
from ...capture.shadow import live_module

__all__ = ["PeerShapes", "peer_size"]


_UNSIZED = object()     # peer_size of a value torchinfo has no shape for (it raises)


def _is_ndarray(x: Any) -> bool:
    np = sys.modules.get("numpy")       # no import: a NumPy array exists only if NumPy was imported
    return np is not None and isinstance(x, np.ndarray)


def _batch_of_one(size: list, batch_dim: int) -> list:
    """``size`` with the entry at ``batch_dim`` replaced by 1 (appended past its end), as torchinfo
    slices it."""
    return size[:batch_dim] + [1] + size[batch_dim + 1:]


def _first_shape(x: Any) -> list:
    """torchinfo's shape of a value nested in an output: the first tensor or array found going down
    ``.tensors`` attributes, dict values (in order) and first elements; [] where there is none."""
    for _ in range(1000):       # a structure that holds itself ends here, shown as nothing
        if hasattr(x, "tensors"):
            x = x.tensors
            continue
        if isinstance(x, torch.Tensor) or _is_ndarray(x):
            return list(x.shape)
        if not hasattr(x, "__getitem__"):
            return []
        try:
            if not x:
                return []
        except Exception:       # noqa: BLE001 -- a truth value that raises: nothing to show
            return []
        if isinstance(x, dict):
            x = list(x.values())
        elif callable(getattr(x, "size", None)) and callable(getattr(x, "element_size", None)):
            return list(x.size())
        elif isinstance(x, (list, tuple)):
            x = x[0]
        else:
            return []
    return []


def peer_size(out: Any, batch_dim: int | None) -> Any:
    """The Output Shape torchinfo 1.8 prints for a module call that returned ``out`` (its reduction of
    a structure to one shape; ``_UNSIZED`` where it raises instead):

    - None: [] (shown ``--``); a tensor or a NumPy array: its shape, as it ran;
    - a list/tuple whose first element has ``.data.size()`` (a tensor, a PackedSequence): that shape,
      with the entry at ``batch_dim`` (if given) set to 1;
    - a dict: the shape of its last value (``_first_shape``), with ``batch_dim`` that shape with the
      entry set to 1, inside a list (printed ``[[1, 10]]``);
    - another list/tuple: ``_first_shape`` of it, the entry at ``batch_dim`` set to 1 if it has one;
    - anything else (a string, a class, a number): torchinfo raises RuntimeError."""
    if out is None:
        return []
    if isinstance(out, (list, tuple)) and out and callable(getattr(getattr(out[0], "data", None), "size", None)):
        size = list(out[0].data.size())
        return size if batch_dim is None else _batch_of_one(size, batch_dim)
    if isinstance(out, dict):
        size = _first_shape(list(out.values())[-1]) if out else []
        return size if batch_dim is None else [_batch_of_one(size, batch_dim)]
    if isinstance(out, torch.Tensor) or _is_ndarray(out):
        return list(out.shape)
    if isinstance(out, (list, tuple)):
        size = _first_shape(out)
        if batch_dim is not None and batch_dim < len(size):
            size[batch_dim] = 1
        return size
    return _UNSIZED


class PeerShapes:
    """torchinfo's Output Shape of each module call (``peer_size``), noted by a forward hook on each
    module for as long as the ``with`` block lasts (the forward layerscope analyses runs inside it):
    by (module, its call index), the numbering of the report's records. Calls from other threads are
    not noted; ScriptModules get no hooks (TorchScript runs no hooks inside them, nor does torchinfo
    put any on them). ``unsized``: the first call whose output torchinfo has no shape for (module
    path, what it returned), else None. The hooks come off when the block ends, also on an error."""

    def __init__(self, model: nn.Module, batch_dim: int | None) -> None:
        self.model, self.batch_dim = model, batch_dim
        self.shapes: dict[tuple[int, int], Any] = {}
        self.unsized: tuple[str, str] | None = None
        self._calls: dict[int, int] = {}          # module -> its calls begun so far
        self._open: dict[int, list[int]] = {}     # module -> the call indices of its open calls
        self._handles: list = []
        self._thread = threading.get_ident()
        self._paths: dict[int, str] = {}

    def get(self, module: nn.Module, call_index: int):
        return self.shapes.get((id(module), call_index))

    def _pre(self, module: nn.Module, args) -> None:
        if threading.get_ident() != self._thread:
            return
        key = id(module)
        n = self._calls.get(key, 0)
        self._calls[key] = n + 1
        self._open.setdefault(key, []).append(n)

    def _post(self, module: nn.Module, args, out) -> None:
        if threading.get_ident() != self._thread or not self._open.get(id(module)):
            return
        n = self._open[id(module)].pop()
        try:
            size = peer_size(out, self.batch_dim)
        except Exception:      # noqa: BLE001 -- a structure that cannot be read: its tensors' shape instead
            return
        if size is _UNSIZED:
            size = []
            if self.unsized is None:
                what = (f"the class {out.__qualname__}" if isinstance(out, type)
                        else f"{type(out).__name__} {reprlib.repr(out)}")
                self.unsized = (self._paths.get(id(module), "") or type(module).__name__, what)
        self.shapes[(id(live_module(module)), n)] = size     # by the user's module, not its copy

    def __enter__(self) -> "PeerShapes":
        try:
            for path, m in self.model.named_modules():
                if isinstance(m, torch.jit.ScriptModule):
                    continue
                self._paths[id(m)] = path
                self._handles.append(hooks.forward_pre_hook(m, self._pre))
                self._handles.append(hooks.forward_hook(m, self._post))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for h in self._handles:
            h.remove()
        self._handles.clear()
