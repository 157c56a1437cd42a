"""TorchScript models as a Trace: the same records as the PyTorch path, from the same capture.

A scripted or traced module's forward graph is inlined (every method and function call spliced in;
each node keeps the module hierarchy it came from) and run node by node by a small interpreter on
the example inputs, under layerscope's op recorder. Aten nodes dispatch to the real operators, so
every cost comes from the same formulas as an nn.Module's; the interpreter enters and leaves module
calls as the nodes' hierarchy changes, so layers, parameters (read from the script module's own
submodules) and shapes come out as ``analyze()`` gives them. ``prim::If`` runs the branch its
condition picks; ``prim::Loop`` runs its body as many times as it says.

Files load with ``torch.jit.load`` (TorchScript's own format, never pickle); ``load_saved_model`` reads
the CLI's model.pt: TorchScript, else a pickled module only when the caller allows unpickling.
"""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from typing import Any

import torch

from .. import _compat
from ..errors import ForwardError, InputError, SpecError

__all__ = ["load_torchscript", "load_saved_model", "unpickling_reason", "torchscript_trace"]

_FRAME = re.compile(r"([^.()]+)\(([^()]*)\)")


# torch 2.13 deprecates torch.jit.load with a DeprecationWarning on every call, torch 2.14 with a
# FutureWarning (same words). Loading a file the user named is layerscope's doing, not the user's:
# only that one message, in either category, is silenced, only here.
_JIT_LOAD_DEPRECATED = r"`torch\.jit\.load` is deprecated"


def load_torchscript(src) -> torch.jit.ScriptModule:
    if isinstance(src, torch.jit.ScriptModule):
        return src
    path = os.fspath(src)
    if not os.path.isfile(path):
        raise InputError(f"no TorchScript file at {path!r}")
    try:
        with warnings.catch_warnings():
            for category in (DeprecationWarning, FutureWarning):
                warnings.filterwarnings("ignore", message=_JIT_LOAD_DEPRECATED, category=category)
            return torch.jit.load(path, map_location="cpu")
    except Exception as e:   # a zip that is not TorchScript, a truncated file, ...
        raise InputError(f"{path!r} is not a TorchScript archive torch.jit.load can read: "
                         f"{str(e).splitlines()[0][:200]}") from None


def load_saved_model(path: str, allow_pickle: bool = False) -> torch.nn.Module:
    """A saved model file (the CLI's model.pt): a TorchScript archive (torch.jit.load), else a pickled nn.Module only
    with ``allow_pickle`` (unpickling runs code from the file). Without it the file is read with
    ``torch.load(weights_only=True)``, which executes nothing: a state dict is then refused with what
    to do instead."""
    import zipfile
    if not os.path.isfile(path):
        raise SpecError(f"no model file at {path!r}")
    is_zip = zipfile.is_zipfile(path)
    if is_zip:
        with zipfile.ZipFile(path) as z:
            if any(n.endswith("/constants.pkl") or n.endswith("/code/__torch__.py") or "/code/" in n
                   for n in z.namelist()):
                return load_torchscript(path)
    if allow_pickle:
        try:
            obj = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:
            raise SpecError(f"{path!r} could not be loaded: {type(e).__name__}: {str(e).splitlines()[0][:200]}") \
                from None
        if isinstance(obj, torch.nn.Module):
            return obj
        raise SpecError(f"{path!r} holds a {type(obj).__name__}, not a model")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        # a pickle that names classes (GLOBAL) is a pickled model; other unpickling failures ("Unsupported
        # operand", "invalid load key") are files that are not torch files at all
        if "GLOBAL" in str(e):
            raise SpecError(f"{path!r} is a pickled model: loading it runs code from the file. If you "
                            "trust it, pass --allow-pickle (allow_pickle=True)") from None
        if os.path.getsize(path) == 0:
            raise InputError(f"{path!r} is empty (0 bytes), not a TorchScript or torch.save file") from None
        raise InputError(f"{path!r} is not a TorchScript or torch.save file ({unpickling_reason(e)})") from None
    raise SpecError(f"{path!r} holds {'a state dict' if isinstance(obj, dict) else type(obj).__name__} "
                    "(weights only, no architecture): build the model with path/to/file.py:factory or "
                    "hf:Config and load the weights there")


def unpickling_reason(e: Exception) -> str:
    """Why torch.load(weights_only=True) could not read a file, without its advice to reload with
    weights_only=False (that runs code from the file, and a file of random bytes is no model either):
    the WeightsUnpickler's own reason ("Unsupported operand 216"), else the exception's first line."""
    text = str(e)
    if "WeightsUnpickler error:" in text:
        after = text.split("WeightsUnpickler error:", 1)[1]
        reason = next((line.strip() for line in after.splitlines() if line.strip()), "")
        if reason:
            return f"unpickling failed: {reason[:200]}"
    first = text.splitlines()[0] if text.strip() else ""
    if not first or "weights_only" in first:
        return f"torch.load raised {type(e).__name__}"
    return f"torch.load raised {type(e).__name__}: {first[:200]}"


def _module_path(hierarchy: str, children: dict[str, list[tuple[str, str, str]]]) -> list[str]:
    """'transformer(GPT2Model).0(GPT2Block).SELF(GPT2Block)' -> ['transformer', 'transformer.h.0']:
    the chain of submodule paths. A frame names an attribute of the module before it, or of a
    container in it that is never called (GPT-2's ModuleList ``h``); its type settles which. A
    function frame (UNKNOWN_INSTANCE) ends the chain; SELF is the module itself."""
    chain, path = [], ""
    for name, typ in _FRAME.findall(hierarchy or ""):
        if name == "SELF":
            continue
        if name == "UNKNOWN_INSTANCE":
            break
        found = [p for n, t, p in children.get(path, ()) if n == name]
        if len(found) > 1:
            found = [p for n, t, p in children.get(path, ()) if n == name and t == typ] or found
        if not found:
            break
        path = found[0]
        chain.append(path)
    return chain


def _children(named: list[tuple[str, Any]]) -> dict[str, list[tuple[str, str, str]]]:
    """Per module path: (attribute name, type, path) of the modules a hierarchy frame can name next:
    its children, and the children of its children that are containers without a forward."""
    from ..capture.records import own_forward
    kids: dict[str, list[tuple[str, str, str]]] = {}
    types = {p: getattr(m, "original_name", type(m).__name__) for p, m in named}
    calls = {p: own_forward(m) for p, m in named}
    for p, _ in named:
        if not p:
            continue
        parent, _, name = p.rpartition(".")
        kids.setdefault(parent, []).append((name, types[p], p))
    out: dict[str, list[tuple[str, str, str]]] = {}
    for p, _ in named:
        stack = list(kids.get(p, ()))
        while stack:
            name, typ, q = stack.pop(0)
            out.setdefault(p, []).append((name, typ, q))
            if not calls[q]:
                stack.extend(kids.get(q, ()))
    return out


_SCALAR_OPS = {
    "aten::len": len, "aten::__getitem__": lambda x, i: x[i], "aten::__not__": lambda a: not a,
    "aten::__is__": lambda a, b: a is b, "aten::__isnot__": lambda a, b: a is not b,
    "aten::__contains__": lambda a, b: b in a, "aten::eq": lambda a, b: a == b, "aten::ne": lambda a, b: a != b,
    "aten::lt": lambda a, b: a < b, "aten::le": lambda a, b: a <= b, "aten::gt": lambda a, b: a > b,
    "aten::ge": lambda a, b: a >= b, "aten::add": lambda a, b: a + b, "aten::sub": lambda a, b: a - b,
    "aten::mul": lambda a, b: a * b, "aten::div": lambda a, b: a / b, "aten::floordiv": lambda a, b: a // b,
    "aten::remainder": lambda a, b: a % b, "aten::neg": lambda a: -a, "aten::Int": int, "aten::Float": float,
    "aten::Bool": bool, "aten::list": list, "aten::str": str, "aten::format": lambda f, *a: f.format(*a),
    "aten::warn": lambda *a: None, "aten::append": lambda lst, x: lst.append(x) or lst,
    "aten::dim": lambda t: t.dim(), "aten::size": lambda t, d=None: list(t.size()) if d is None else t.size(d),
    "aten::numel": lambda t: t.numel(), "aten::__and__": lambda a, b: a and b, "aten::__or__": lambda a, b: a or b,
    "aten::min": lambda *a: min(*a), "aten::max": lambda *a: max(*a), "aten::sqrt": lambda a: a ** 0.5,
    "prim::min": lambda *a: min(*a), "prim::max": lambda *a: max(*a), "aten::item": lambda t: t.item(),
    "aten::is_floating_point": lambda t: t.is_floating_point(), "aten::manual_seed": lambda *a: None,
}


def _num_to_tensor(v) -> torch.Tensor:
    """prim::NumToTensor by TorchScript's own operator: an int gives a 0-dim int64 tensor, a float
    float64, a bool bool. torch.scalar_tensor made every number float32, so a traced
    ``torch.arange(ids.shape[1])`` fed float position ids to an embedding (issue 18)."""
    return torch.ops.prim.NumToTensor(v)


def _op_for(node) -> Any:
    """The OpOverload a node's schema names."""
    schema = _compat.parse_schema(node.schema())
    ns, name = schema.name.split("::")
    packet = getattr(getattr(torch.ops, ns), name)
    return getattr(packet, schema.overload_name or "default"), schema


class _Interpreter:
    def __init__(self, named: list[tuple[str, Any]], enter, leave) -> None:
        self.modules = dict(named)
        self.children = _children(named)
        self.chains: dict[str, list[str]] = {}
        self.enter, self.leave = enter, leave      # module call tracking (the capture's pre/post hooks)
        self.open: list[str] = []                  # module paths entered, outermost first
        self.ran: list[set] = []                   # per open call: the nodes that ran in it
        self.alive: dict[int, Any] = {}           # node wrappers kept alive, so their ids stay theirs
        self.last_out: Any = None
        self.ops_cache: dict[str, Any] = {}

    def _move_to(self, chain: list[str], inputs, node=None) -> None:
        """Leave the open calls the node is not in and enter those it is in. A node that already ran
        in an open call (a loop calling the same module again) ends that call and begins another."""
        k = 0
        while k < len(self.open) and k < len(chain) and self.open[k] == chain[k]:
            if node is not None and node in self.ran[k]:
                break
            k += 1
        while len(self.open) > k:
            self.leave(self.modules[self.open.pop()], self.last_out)
            self.ran.pop()
        for path in chain[k:]:
            if path not in self.modules:
                break
            self.enter(self.modules[path], inputs)
            self.open.append(path)
            self.ran.append(set())
        if node is not None:
            for seen in self.ran:
                seen.add(node)

    def close(self, output) -> None:
        self.last_out = output
        self._move_to([], ())

    def run(self, block, env: dict) -> list:
        for node in block.nodes():
            outs = self.node(node, env)
            for v, o in zip(node.outputs(), outs):
                env[v.unique()] = o
        return [env[v.unique()] for v in block.outputs()]

    def node(self, node, env: dict) -> list:
        kind = node.kind()
        ins = [env[v.unique()] for v in node.inputs()]
        if kind == "prim::Constant":
            return [node.output().toIValue()]
        if kind == "prim::GetAttr":
            return [getattr(ins[0], node.s("name"))]
        if kind in ("prim::ListConstruct",):
            return [list(ins)]
        if kind == "prim::TupleConstruct":
            return [tuple(ins)]
        if kind == "prim::DictConstruct":
            return [dict(zip(ins[::2], ins[1::2]))]
        if kind in ("prim::ListUnpack", "prim::TupleUnpack"):
            return list(ins[0])
        if kind == "prim::TupleIndex":
            return [ins[0][ins[1]]]
        if kind in ("prim::unchecked_cast", "prim::Uninitialized", "aten::detach_", "prim::profile"):
            return [ins[0] if ins else None]
        if kind == "prim::dtype":
            return [ins[0].dtype]
        if kind == "prim::device":
            return [ins[0].device]
        if kind == "prim::NumToTensor":
            return [_num_to_tensor(ins[0])]
        if kind == "prim::RaiseException":
            raise InputError(f"the TorchScript model raised: {ins[0] if ins else ''}")
        if kind == "prim::If":
            return self.run(list(node.blocks())[0 if ins[0] else 1], env)
        if kind == "prim::Loop":
            body = list(node.blocks())[0]
            trips, cond, carried = ins[0], ins[1], list(ins[2:])
            params = list(body.inputs())
            i = 0
            while cond and i < trips:
                env[params[0].unique()] = i
                for p, v in zip(params[1:], carried):
                    env[p.unique()] = v
                res = self.run(body, env)
                cond, carried = res[0], list(res[1:])
                i += 1
            return carried
        if kind.startswith("prim::") and kind not in _SCALAR_OPS or kind in ("prim::CallMethod", "prim::CallFunction"):
            raise InputError(f"TorchScript node {kind} is not supported by the analysis")
        if not any(isinstance(a, torch.Tensor) or (isinstance(a, (list, tuple)) and
                                                   any(isinstance(x, torch.Tensor) for x in a)) for a in ins):
            fn = _SCALAR_OPS.get(kind)
            if fn is not None:
                return [fn(*ins)]
        if kind in ("aten::size", "aten::dim", "aten::numel", "aten::item", "aten::len", "aten::__getitem__",
                    "aten::append", "aten::is_floating_point", "aten::warn", "aten::__is__", "aten::__isnot__",
                    "aten::format", "aten::list"):
            return [_SCALAR_OPS[kind](*ins)]
        # a tensor op: dispatch to the operator the node's schema names
        h = node.getModuleHierarchy()
        chain = self.chains.get(h)
        if chain is None:
            chain = self.chains[h] = _module_path(h, self.children)
        self.alive[id(node)] = node
        self._move_to(chain, [a for a in ins if isinstance(a, torch.Tensor)], id(node))
        op, schema = self.ops_cache.get(node.schema()) or self.ops_cache.setdefault(node.schema(), _op_for(node))
        args, kwargs = [], {}
        for a, v in zip(schema.arguments, ins):
            if a.kwarg_only:
                kwargs[a.name] = v
            else:
                args.append(v)
        out = op(*args, **kwargs)
        self.last_out = out
        n = node.outputsSize()
        return list(out) if n > 1 else [out]


def torchscript_trace(src, example_inputs: tuple, options=None):
    """Run a TorchScript module on ``example_inputs`` under the capture; returns the Trace."""
    from ..capture.recorder import OpRecorder
    from ..capture.records import build_trace
    from ..capture.session import Session
    from ..capture.state import StateGuard, held_tensors
    from ..costs import CostOptions

    module = load_torchscript(src)
    if not isinstance(example_inputs, tuple):
        example_inputs = (example_inputs,)
    graph = module.forward.graph.copy()
    _compat.jit_inline(graph)
    named = list(module.named_modules())
    mods = [m for _, m in named]
    cap = Session(module, options or CostOptions(), track_seq=False)
    for path, m in named:
        cap.paths[id(m)] = path
    cap.seed_producers(example_inputs, held_tensors(mods, "_parameters") + held_tensors(mods, "_buffers"))
    guard = StateGuard(module, mods, example_inputs)
    interp = _Interpreter(named, lambda m, ins: cap.enter(m, tuple(ins), {}),
                          lambda m, out: cap.exit(m, (), {}, out))
    inputs = list(graph.inputs())
    if len(inputs) - 1 != len(example_inputs):
        raise InputError(f"the TorchScript forward takes {len(inputs) - 1} inputs "
                         f"({', '.join(v.debugName() for v in inputs[1:])}); {len(example_inputs)} were given")
    env = {inputs[0].unique(): module}
    for v, x in zip(inputs[1:], example_inputs):
        env[v.unique()] = x
    try:
        with torch.no_grad(), OpRecorder(cap):
            cap.enter(module, example_inputs, {})
            try:
                out = interp.run(graph, env)
            except InputError:
                raise
            except Exception as e:
                where = interp.open[-1] if interp.open else "(root)"
                raise ForwardError(f"the TorchScript forward failed in {where}: {type(e).__name__}: "
                                   f"{str(e).splitlines()[0][:300]}") from e
            output = out[0] if len(out) == 1 else tuple(out)
            interp.close(output)
            cap.exit(module, example_inputs, {}, output)
    finally:
        guard.restore()
    for c in cap.calls:                   # script modules keep their Python class name aside
        c.type = getattr(c.module, "original_name", c.type)
    trace = build_trace(cap, module, named, example_inputs, output, backward=False,
                        options={"mode": "same", "format": "torchscript", "device": "cpu"})
    # a module that computes nothing (nn.Identity) leaves no node in the graph: only a module with
    # parameters of its own and no node is reported as never called
    held = {p for p, m in named if any(True for _ in m.parameters(recurse=False))}
    uncalled = tuple(p for p in trace.uncalled_modules if p in held)
    return dataclasses.replace(trace, model_name=getattr(module, "original_name", trace.model_name),
                               uncalled_modules=uncalled)
