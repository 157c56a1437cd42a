"""torch.export programs (``ExportedProgram``, ``.pt2`` files) as a Trace: the same records as ``analyze()``.

An exported program is an FX graph of ATen ops; every node keeps the stack of module calls it came
from (``node.meta["nn_module_stack"]``: call key -> (module path, module type), outermost first;
a module called twice gets a second key, ``lin@1``). The graph runs node by node on example
inputs under layerscope's op recorder, like formats/torchscript.py runs a TorchScript graph: each
ATen node dispatches to the real operator (composite ops such as ``aten.linear`` decompose to the
same ``t``/``addmm`` that an eager run records), so every cost comes from the same formulas, and
module calls open and close as the nodes' stacks change.

The layer tree is rebuilt from those paths: a bare module per path, holding the program's own
parameter and buffer tensors (by their fully qualified names), so parameters, subtree sizes and
shared weights come out as for the eager model. A call's inputs are the values its nodes read
from outside the call (parameters and buffers excluded) and its outputs the values read after it,
which is what the eager module received and returned in the usual case.

Limits: a module that leaves no node in the graph (``nn.Identity``, a module whose work export
folded into constants) is not a layer here; kernel sizes are known for convolutions (from the
weight) and pools (from the op's arguments, as a tuple). A dim the inputs do not settle is named
in the error; it is never sized 0. Files load with ``torch.export.load`` (no pickle of code).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import zipfile
from typing import Any

import torch
from torch import nn

from .. import _compat
from ..errors import ForwardError, InputError, LayerscopeError

__all__ = ["load_exported", "exported_trace", "graph_module_trace", "is_exported_module", "compiled_original"]

# ops that read shapes or check them: eager runs never dispatch them, so they are not recorded
_SILENT_PREFIXES = ("_assert", "sym_", "sym_size", "sym_numel", "sym_stride", "sym_storage_offset",
                    "_check", "_print")


def load_exported(src) -> torch.export.ExportedProgram:
    if isinstance(src, torch.export.ExportedProgram):
        return src
    try:
        path = os.fspath(src)
    except TypeError:
        raise InputError(f"expected an ExportedProgram or a .pt2 path, got {type(src).__name__}") from None
    if not os.path.isfile(path):
        raise InputError(f"no torch.export file at {path!r}")
    if not zipfile.is_zipfile(path):
        # checked before torch.export.load, which logs a dozen lines of warnings before it raises
        raise InputError(f"{path!r} is not a torch.export program (a .pt2 file is a zip archive; "
                         f"this one is not)")
    try:
        return torch.export.load(path)
    except Exception as e:   # a zip that is not a .pt2 program, a truncated file, a newer format ...
        raise InputError(f"{path!r} is not a torch.export program torch.export.load can read: "
                         f"{str(e).splitlines()[0][:200] if str(e) else type(e).__name__}") from None


def is_exported_module(m: Any) -> bool:
    """``ep.module()``: a GraphModule whose train()/eval() export replaced by ones that raise."""
    return isinstance(m, torch.fx.GraphModule) and ("eval" in vars(m) or "train" in vars(m))


def _norm_path(path: str) -> str:
    # strict export names paths as Python expressions of the root: L['self'].conv, L['self'].h[0]
    for head in ("L['self'].", "L['self']"):
        if path.startswith(head):
            path = path[len(head):]
    return path.replace("[", ".").replace("]", "").replace("'", "")


def _chain(node) -> list[tuple[str, str, str]]:
    stack = node.meta.get("nn_module_stack") or {}
    out = []
    for key, val in stack.items():
        path, typ = val[0], val[1]
        path = _norm_path(path)
        if path:
            out.append((key, path, typ if isinstance(typ, str) else getattr(typ, "__name__", str(typ))))
    return out


def _root_type(graph) -> str | None:
    for n in graph.nodes:
        for _, val in (n.meta.get("nn_module_stack") or {}).items():
            if not _norm_path(val[0]):
                typ = val[1] if isinstance(val[1], str) else getattr(val[1], "__name__", str(val[1]))
                return typ.rsplit(".", 1)[-1]
    return None


def _is_op(node) -> bool:
    return node.op in ("call_function", "call_method") or (node.op == "call_module" and node.target != "_guards_fn")


class _Plan:
    """The module calls of one graph run, found before it runs: per op node the calls open at it,
    per call its module path, type, inputs (values read from outside, state excluded) and outputs
    (values read after it)."""

    def __init__(self, graph, state_nodes: set) -> None:
        self.calls: list[dict] = []
        self.open_at: dict[Any, tuple[int, ...]] = {}
        open_: list[int] = []
        for n in graph.nodes:
            if not _is_op(n):
                continue
            ch = _chain(n)
            k = 0
            while k < len(open_) and k < len(ch) and self.calls[open_[k]]["key"] == ch[k][0]:
                k += 1
            del open_[k:]
            for key, path, typ in ch[k:]:
                self.calls.append({"key": key, "path": path, "type": typ.rsplit(".", 1)[-1], "nodes": []})
                open_.append(len(self.calls) - 1)
            self.open_at[n] = tuple(open_)
            for c in open_:
                self.calls[c]["nodes"].append(n)
        for c in self.calls:
            inside = set(c["nodes"])
            ins: list = []
            for n in c["nodes"]:
                for a in n.all_input_nodes:
                    if a not in inside and a not in state_nodes and a.op != "get_attr" and a not in ins:
                        ins.append(a)
            c["inputs"] = ins
            c["outputs"] = [n for n in c["nodes"] if any(u not in inside for u in n.users)]


def _shadow_tree(state: list[tuple[str, torch.Tensor, str]], paths: list[str]) -> nn.Module:
    """Bare modules at the original paths, holding the program's own tensors by name."""
    root = nn.Module()

    def at(path: str) -> nn.Module:
        m = root
        for part in path.split(".") if path else ():
            child = m._modules.get(part)
            if child is None:
                child = nn.Module()
                m.add_module(part, child)
            m = child
        return m

    for p in paths:
        at(p)
    for fqn, t, kind in state:
        owner, _, name = fqn.rpartition(".")
        m = at(owner)
        if kind == "param":
            m._parameters[name] = t if isinstance(t, nn.Parameter) else nn.Parameter(t, requires_grad=False)
        elif kind == "buffer":
            m._buffers[name] = t
    return root


def _kernel_of(node) -> tuple[int, ...] | None:
    name = getattr(node.target, "_opname", "") or ""
    if "pool" in name and len(node.args) > 1 and isinstance(node.args[1], (list, tuple)):
        k = tuple(int(k) for k in node.args[1])
        # the module's own kernel_size is lost in the graph: a square kernel reads as the int most
        # models pass (MaxPool2d(2).kernel_size == 2 -> (2,)); MaxPool2d((2, 2)) would read (2, 2)
        return k[:1] if len(set(k)) == 1 else k
    return None


def _set_kernels(plan: _Plan, modules: dict) -> None:
    """Kernel sizes on the shadow modules as eager modules have them."""
    for c in plan.calls:
        m = modules[c["path"]]
        w = m._parameters.get("weight")
        if "Conv" in c["type"] and w is not None and w.dim() > 2:
            m.kernel_size = tuple(int(s) for s in w.shape[2:])
        elif "Pool" in c["type"] and "Adaptive" not in c["type"]:   # adaptive pools have no kernel
            k = next((_kernel_of(n) for n in c["nodes"] if _kernel_of(n)), None)
            if k is not None:
                m.kernel_size = k


def _is_silent(fn) -> bool:
    """A callable the recorder must not see: not an op, or an op that only reads or checks shapes."""
    return not _compat.is_op_overload(fn) and \
        not _compat.is_higher_order_op(fn) and not isinstance(fn, nn.Module) \
        or _compat.is_op_overload(fn) and fn._opname.startswith(_SILENT_PREFIXES)


class _Interpreter:
    """Runs a graph's nodes under the capture, entering and leaving the calls the plan opens at each."""

    def __init__(self, cap, plan: _Plan, modules: dict, env: dict, get_attr) -> None:
        self.cap, self.plan, self.modules, self.env, self.get_attr = cap, plan, modules, env, get_attr
        self.opened: list[int] = []

    def value(self, x):
        return torch.fx.node.map_arg(x, lambda a: self.env[a])

    def leave(self, c: int) -> None:
        outs = [self.env[n] for n in self.plan.calls[c]["outputs"] if n in self.env]
        self.cap.exit(self.modules[self.plan.calls[c]["path"]], (), {}, outs[0] if len(outs) == 1 else tuple(outs))

    def open_for(self, n) -> None:
        """Leave the calls this node is not in, enter those it is in that are not open yet."""
        want, opened = self.plan.open_at[n], self.opened
        k = 0
        while k < len(opened) and k < len(want) and opened[k] == want[k]:
            k += 1
        while len(opened) > k:
            self.leave(opened.pop())
        for c in want[k:]:
            self.cap.enter(self.modules[self.plan.calls[c]["path"]],
                           tuple(v for v in (self.env[a] for a in self.plan.calls[c]["inputs"] if a in self.env)
                                 if isinstance(v, torch.Tensor)), {})
            opened.append(c)

    def call(self, n) -> None:
        args, kwargs = self.value(n.args), self.value(n.kwargs)
        try:
            if n.op == "call_module":
                fn = self.get_attr(n.target)
            elif n.op == "call_method":
                fn = getattr(args[0], n.target)
                args = args[1:]
            else:
                fn = n.target
            self.cap.paused = _is_silent(fn)
            try:
                self.env[n] = fn(*args, **kwargs)
            finally:
                self.cap.paused = False
        except LayerscopeError:
            raise
        except Exception as e:
            where = self.plan.calls[self.opened[-1]]["path"] if self.opened else "(root)"
            raise ForwardError(f"the exported program failed in {where} at node {n.name} "
                               f"({n.target}): {type(e).__name__}: {str(e).splitlines()[0][:300]}",
                               path=where) from e

    def run(self, graph, root: nn.Module, inputs, pick_output):
        """The program's output, picked by ``pick_output`` from the output node's values."""
        from ..capture.recorder import OpRecorder
        output = None
        with torch.no_grad(), OpRecorder(self.cap):
            self.cap.enter(root, tuple(_compat.tree_leaves(inputs)), {})
            for n in graph.nodes:
                if n.op == "placeholder":
                    continue
                if n.op == "get_attr":
                    self.env[n] = self.get_attr(n.target)
                    continue
                if n.op == "output":
                    while self.opened:
                        self.leave(self.opened.pop())
                    output = pick_output(self.value(n.args[0]))
                    break
                if not _is_op(n):
                    continue
                self.open_for(n)
                self.call(n)
            self.cap.exit(root, (), {}, output)
        return output


def _run(graph, *, get_attr, placeholders: dict, state: list, root_name: str | None, fmt: str,
         device: str, user_inputs: Any, pick_output, options=None):
    from ..capture.records import build_trace
    from ..capture.session import Session
    from ..capture.state import StateGuard
    from ..costs import CostOptions

    state_nodes = {n for n in graph.nodes if n.op == "placeholder" and n.name in placeholders
                   and n.name not in user_inputs[1]}
    plan = _Plan(graph, state_nodes)
    root = _shadow_tree(state, [c["path"] for c in plan.calls])
    named = list(root.named_modules())
    modules = dict(named)
    types = {c["path"]: c["type"] for c in plan.calls}
    _set_kernels(plan, modules)
    inputs = user_inputs[0]
    cap = Session(root, options or CostOptions(), track_seq=False)
    for path, m in named:
        cap.paths[id(m)] = path
    cap.seed_producers(inputs, [t for _, t, k in state if isinstance(t, torch.Tensor)])
    guard = StateGuard(root, [m for _, m in named], inputs)
    env: dict = dict((n, placeholders[n.name]) for n in graph.nodes if n.op == "placeholder")
    try:
        output = _Interpreter(cap, plan, modules, env, get_attr).run(graph, root, inputs, pick_output)
    finally:
        guard.restore()
    for c in cap.calls:
        c.type = types.get(c.path, root_name or "ExportedProgram") if c.path else (root_name or "ExportedProgram")
    trace = build_trace(cap, root, named, inputs, output, backward=False,
                        options={"mode": "same", "format": fmt, "device": device})
    return dataclasses.replace(trace, model_name=root_name or "ExportedProgram")


def _input_specs(ep) -> list:
    return list(ep.graph_signature.input_specs)


def _check_inputs(names: list[str], placeholders: dict, graph) -> None:
    """Static dims of the inputs must be those the program was exported with; the message names the
    input and the dim."""
    by_name = {n.name: n for n in graph.nodes if n.op == "placeholder"}
    for name in names:
        val = by_name[name].meta.get("val")
        got = placeholders[name]
        if isinstance(val, torch.Tensor):
            if not isinstance(got, torch.Tensor):
                raise InputError(f"the exported program's input {name!r} is a tensor; got {type(got).__name__}")
            if got.dim() != val.dim():
                raise InputError(f"the exported program's input {name!r} has {val.dim()} dims "
                                 f"{list(val.shape)}; got {list(got.shape)}")
            for i, (want, have) in enumerate(zip(val.shape, got.shape)):
                if isinstance(want, int) and want != have:
                    raise InputError(f"the exported program's input {name!r} has a static dim {i} of "
                                     f"{want} (shape {list(val.shape)}); got {list(got.shape)}")


def _inputs_from_program(ep, user_names: list[str]) -> tuple[tuple, dict]:
    """The example inputs stored in the program; else inputs built from the placeholders' shapes
    when every dim is static. A symbolic dim the program leaves open is named, never sized 0."""
    ex = getattr(ep, "example_inputs", None)
    if ex is not None:
        args, kwargs = ex
        return tuple(args), dict(kwargs)
    by_name = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    built = []
    for name in user_names:
        val = by_name[name].meta.get("val")
        if not isinstance(val, torch.Tensor):
            raise InputError(f"the exported program stores no example inputs and its input {name!r} is not "
                             "a tensor: pass example inputs")
        for i, s in enumerate(val.shape):
            if not isinstance(s, int):
                rng = ep.range_constraints.get(getattr(s, "node", None) and s.node.expr)
                raise InputError(f"the exported program stores no example inputs and dim {i} of input "
                                 f"{name!r} is symbolic ({s}{', range ' + str(rng) if rng else ''}): pass "
                                 "example inputs or input_size")
        built.append(torch.zeros(tuple(val.shape), dtype=val.dtype) if not val.is_floating_point()
                     else torch.randn(tuple(val.shape), dtype=val.dtype))
    spec = ep.call_spec.in_spec
    args, kwargs = _compat.tree_unflatten(built, spec)
    return tuple(args), dict(kwargs)


def _given_inputs(ep, args: tuple, kwargs: dict, device: str | None, user_names: list[str]) -> tuple:
    """(args, kwargs, flat leaves): the stored inputs when none are given, on meta for device="meta",
    checked against the structure and count the program was exported with."""
    if not args and not kwargs:
        args, kwargs = _inputs_from_program(ep, user_names)
    if device not in (None, "cpu", "meta"):
        raise InputError(f"an exported program is analysed on CPU or device='meta', not {device!r}")
    if device == "meta":
        args, kwargs = _compat.tree_map_only(torch.Tensor, lambda t: torch.empty_like(t, device="meta"),
                                             (tuple(args), kwargs))
    flat, spec = _compat.tree_flatten((tuple(args), kwargs))
    in_spec = ep.call_spec.in_spec
    if in_spec is not None and spec != in_spec:
        raise InputError(f"the exported program takes {len(user_names)} inputs "
                         f"({', '.join(user_names)}) structured as when exported; got {len(flat)} "
                         f"({'positional' if not kwargs else 'with keywords ' + ', '.join(kwargs)})")
    if len(flat) != len(user_names):
        raise InputError(f"the exported program takes {len(user_names)} inputs ({', '.join(user_names)}); "
                         f"{len(flat)} were given")
    return args, kwargs, flat


def _state_inputs(ep, specs: list, placeholders: dict) -> list[tuple[str, Any, str]]:
    """The program's parameters, buffers and constants as (name, tensor, kind), set as placeholders too."""
    from torch.export.graph_signature import InputKind
    state: list[tuple[str, Any, str]] = []
    sd, consts = ep.state_dict, ep.constants
    tied: dict = {}
    for s in specs:
        if s.kind == InputKind.USER_INPUT:
            continue
        if s.kind == InputKind.PARAMETER:
            t, kind = sd[s.target], "param"
        elif s.kind == InputKind.BUFFER:
            t, kind = (sd[s.target] if s.target in sd else consts[s.target]), "buffer"
        elif s.kind in (InputKind.CONSTANT_TENSOR, InputKind.CUSTOM_OBJ):
            t, kind = consts[s.target], "constant"
        else:
            raise InputError(f"the exported program has a {s.kind.name} input ({s.arg.name}), which the "
                             "analysis does not support")
        # tied weights (GPT-2's lm_head and wte) are one tensor in a live program but two Parameters on
        # one storage after torch.export.load: the same memory and geometry is the same tensor
        if isinstance(t, torch.Tensor) and t.numel() and t.device.type != "meta":
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
            t = tied.setdefault(key, t)
        placeholders[s.arg.name] = t
        state.append((s.target, t, kind))
    return state


def _state_to_meta(specs: list, placeholders: dict, state: list) -> None:
    """Meta copies of the state in place (one copy per tensor, Parameters kept Parameters)."""
    from torch.export.graph_signature import InputKind

    from ..capture.state import empty_like_on
    meta = {}
    for i, (fqn, t, kind) in enumerate(state):
        if isinstance(t, torch.Tensor):
            m = meta.get(id(t))
            if m is None:
                m = meta[id(t)] = nn.Parameter(empty_like_on(t, "meta"), t.requires_grad) \
                    if isinstance(t, nn.Parameter) else empty_like_on(t, "meta")
            state[i] = (fqn, m, kind)
    for s in specs:
        if s.kind != InputKind.USER_INPUT and isinstance(placeholders[s.arg.name], torch.Tensor):
            placeholders[s.arg.name] = meta[id(placeholders[s.arg.name])]


def _output_picker(ep):
    """The user's outputs out of the graph's output values, in the structure the program returns."""
    out_names = [s.arg.name if hasattr(s.arg, "name") else None for s in ep.graph_signature.output_specs]
    user_out = [i for i, s in enumerate(ep.graph_signature.output_specs) if s.kind.name == "USER_OUTPUT"]

    def pick(outs):
        outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        vals = [outs[i] for i in user_out] if len(outs) == len(out_names) else outs
        try:
            return _compat.tree_unflatten(vals, ep.call_spec.out_spec)
        except Exception:
            return vals[0] if len(vals) == 1 else tuple(vals)
    return pick


def exported_trace(src, args: tuple = (), kwargs: dict | None = None, *, device: str | None = None,
                   options=None):
    """Run an ExportedProgram (or a ``.pt2`` file) on example inputs under the capture; returns the
    Trace. Without inputs, the program's stored example inputs are used. ``device="meta"`` runs on
    meta copies of the state and inputs (nothing computed or allocated)."""
    from torch.export.graph_signature import InputKind

    ep = load_exported(src)
    kwargs = dict(kwargs or {})
    specs = _input_specs(ep)
    user_names = [s.arg.name for s in specs if s.kind == InputKind.USER_INPUT]
    args, kwargs, flat = _given_inputs(ep, args, kwargs, device, user_names)
    on_meta = device == "meta"
    placeholders: dict[str, Any] = dict(zip(user_names, flat))
    state = _state_inputs(ep, specs, placeholders)
    if on_meta:
        _state_to_meta(specs, placeholders, state)
    _check_inputs(user_names, placeholders, ep.graph)
    return _run(ep.graph, get_attr=functools.partial(_get_attr, ep.graph_module), placeholders=placeholders,
                state=state, root_name=_root_type(ep.graph), fmt="torch.export",
                device="meta" if on_meta else "cpu", user_inputs=((tuple(args), kwargs), set(user_names)),
                pick_output=_output_picker(ep), options=options)


def _get_attr(root, target: str):
    return functools.reduce(getattr, target.split("."), root)


def graph_module_trace(gm: torch.fx.GraphModule, args: tuple, kwargs: dict, options=None):
    """The same for ``ep.module()``: its graph reads parameters and buffers with get_attr nodes."""
    names = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    flat = _compat.tree_leaves((tuple(args), dict(kwargs)))
    if len(flat) != len(names):
        raise InputError(f"the exported module takes {len(names)} inputs ({', '.join(names)}); "
                         f"{len(flat)} were given")
    placeholders = dict(zip(names, flat))
    _check_inputs(names, placeholders, gm.graph)
    state = [(n, t, "param") for n, t in gm.named_parameters(remove_duplicate=False)]
    state += [(n, t, "buffer") for n, t in gm.named_buffers(remove_duplicate=False)]
    out_spec = getattr(gm, "_out_spec", None)

    def pick(outs):
        vals = list(outs) if isinstance(outs, (list, tuple)) else [outs]
        if out_spec is not None:
            try:
                return _compat.tree_unflatten(vals, out_spec)
            except Exception:
                pass
        return vals[0] if len(vals) == 1 else tuple(vals)

    return _run(gm.graph, get_attr=functools.partial(_get_attr, gm), placeholders=placeholders, state=state,
                root_name=_root_type(gm.graph), fmt="torch.export", device="cpu",
                user_inputs=((tuple(args), dict(kwargs)), set(names)), pick_output=pick, options=options)


def compiled_original(model: Any):
    """A torch.compile'd module's original module, else None (torch's dynamo is not imported here:
    a compiled module exists only once it has been)."""
    return _compat.compiled_original(model)


def refuse_exported(model: Any, entry: str) -> None:
    """One clear line where an entry point needs train()/eval() or a module tree to run, which an
    exported program (or its ep.module()) does not have."""
    if isinstance(model, torch.export.ExportedProgram) or is_exported_module(model):
        raise InputError(f"{entry}() cannot run an exported program (its module refuses train()/eval() and "
                         "calls no submodules): pass the eager model, or a Report of "
                         "layerscope.analyze_exported() to partition() for a split by costs")
