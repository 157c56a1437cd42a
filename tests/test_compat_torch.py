"""Private torch APIs live behind layerscope._compat (issue 20 item 4): ``import layerscope`` resolves
none of them, a torch that lacks one still imports layerscope (and gets a fallback or an error that
names the torch version needed), and no other module names a private torch API directly."""

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from layerscope import _compat

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
PACKAGE = SRC / "layerscope"


def _run(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (an import is only fresh once per process)."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(SRC)})


@pytest.fixture
def older_torch(monkeypatch):
    """Play a torch that lacks the named private APIs: their resolvers raise as a missing attribute does."""
    def lacking(*names):
        for name in names:
            what, since, _ = _compat._API[name]

            def gone(what=what):
                raise AttributeError(f"module has no attribute {what!r}")
            monkeypatch.setitem(_compat._API, name, (what, since, gone))
        _compat.forget()

    yield lacking
    monkeypatch.undo()
    _compat.forget()


def test_import_resolves_no_private_api():
    r = _run("""
        import layerscope
        from layerscope import _compat
        assert _compat._cache == {}, sorted(_compat._cache)
        print("ok")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_every_private_api_resolves_on_this_torch():
    # a resolver that names its API wrongly would look like an older torch: each resolves here
    _compat.forget()
    assert [n for n in _compat._API if not _compat.has(n)] == []


def test_import_without_version_dependent_apis():
    # torch 2.4-2.7: no aten._grouped_mm; and a torch without autograd sequence numbers. The ops are removed from torch.ops for real before layerscope is imported (their formulas are
    # registered at import); the other APIs by making their resolvers fail, as on an older torch.
    r = _run("""
        import torch
        aten = torch.ops.aten
        gone = {"_grouped_mm", "_scaled_grouped_mm"}
        for n in gone:
            aten.__dict__.pop(n, None)
        namespace = type(aten)
        original = namespace.__getattr__
        def without(self, name):
            if self is aten and name in gone:
                raise AttributeError(name)
            return original(self, name)
        namespace.__getattr__ = without
        assert not hasattr(torch.ops.aten, "_grouped_mm")

        import layerscope
        from layerscope import _compat
        from layerscope.costs.registry import registered_names
        assert "aten::_grouped_mm" not in registered_names()
        assert "aten::mm" in registered_names()

        def gone_api():
            raise AttributeError("absent")
        for name in ("sequence_nr", "grouped_mm"):
            what, since, _ = _compat._API[name]
            _compat._API[name] = (what, since, gone_api)
        _compat.forget()

        model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
        rep = layerscope.analyze(model, torch.randn(2, 4))
        assert rep.totals.forward.macs == 24, rep.totals
        try:
            layerscope.analyze(model, torch.randn(2, 4), backward=True)
        except _compat.TorchFeatureError as e:
            print(e)
        else:
            raise AssertionError("backward attribution ran without sequence numbers")
    """)
    assert r.returncode == 0, r.stderr
    message = r.stdout.strip()
    assert "torch._C._autograd._get_sequence_nr" in message and "torch >= 2.4" in message
    assert torch.__version__ in message


def test_missing_api_error_names_the_version(older_torch):
    older_torch(*_compat._API)
    for name, (what, since, _) in _compat._API.items():
        assert not _compat.has(name) and _compat.get(name) is None
        with pytest.raises(_compat.TorchFeatureError) as e:
            _compat.need(name, "some feature")
        assert f"some feature needs {what}" in str(e.value) and f"torch >= {since}" in str(e.value)
    assert _compat._API["grouped_mm"][1] == "2.8"


def test_fallbacks_on_an_older_torch(older_torch):
    older_torch("grouped_mm", "sequence_nr", "TorchDispatchMode")
    # no _grouped_mm: the recorder compares ops with None, which no op is
    assert _compat.get("grouped_mm") is None
    # a dispatch mode (the op recorder) needs TorchDispatchMode: the error names it and the version.
    # A fresh one: the recorder's class is made once, on first use, and may exist already
    @_compat.dispatch_mode
    class Mode:
        pass
    with pytest.raises(_compat.TorchFeatureError, match=r"TorchDispatchMode.*torch >= 2\.4"):
        Mode()


def test_latency_skips_backward_timing_without_sequence_numbers(older_torch):
    older_torch("sequence_nr")
    from layerscope.capture.timing import Recorder
    assert Recorder(torch.nn.Linear(2, 2), torch.device("cpu"), backward=True).backward is False


def test_dispatch_modes_are_made_on_first_use():
    from layerscope.capture.state import _PrivateRngMode
    from layerscope.capture.rng import PrivateRNG
    from torch.utils._python_dispatch import TorchDispatchMode
    mode = _PrivateRngMode(PrivateRNG())
    assert isinstance(mode, TorchDispatchMode) and type(mode).__name__ == "_PrivateRngMode"
    assert type(_PrivateRngMode(PrivateRNG())) is type(mode)   # one class, made once
    with mode:
        assert torch.ones(2).sum().item() == 2


# ---- no private torch API outside _compat --------------------------------------------------------------

# what the check allows outside layerscope/_compat/:
# * aten ops by name (torch.ops.<ns>.<op>): ops are the dispatcher's public surface, and those below
#   have existed in every torch 2.x; ops that come and go between releases are resolved in _compat
# * render/deepspeed.py's torch.nn.modules.module._addindent: a string-indenting helper used to print
#   DeepSpeed's layout, resolved only when that renderer runs (render/ is owned elsewhere)
_VERSIONED_OPS = {"_grouped_mm", "_scaled_grouped_mm"}
_ALLOWED = {("render/deepspeed.py", "torch.nn.modules.module._addindent")}


def _private_torch_names(path: pathlib.Path):
    """(line, dotted name) for every private torch name the module's code spells out: imports,
    attribute chains, and strings that are not docstrings (``sys.modules.get("torch._dynamo...")``)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and n.body and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Attribute):
            names = [ast.unparse(node)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            names = [node.value]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] != "torch" or not any(p.startswith("_") and not p.startswith("__") for p in parts[1:]):
                continue
            if parts[1] == "ops" and len(parts) >= 4 and not parts[2].startswith("_") and \
                    parts[3] not in _VERSIONED_OPS and not any(p.startswith("_") for p in parts[4:]):
                continue
            yield node.lineno, name


def test_no_private_torch_api_outside_compat():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("_compat/"):
            continue
        found += [f"{rel}:{line}: {name}" for line, name in _private_torch_names(path)
                  if (rel, name) not in _ALLOWED]
    assert found == [], "private torch APIs outside layerscope/_compat/:\n" + "\n".join(found)


def test_the_check_sees_what_it_forbids(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text(textwrap.dedent('''
        """torch._C in a docstring is fine."""
        import sys
        import torch
        import torch.fx.experimental._config as cfg
        from torch._subclasses.fake_tensor import FakeTensor
        seq = torch._C._autograd._get_sequence_nr
        op = torch.ops.aten._grouped_mm.default
        ok = torch.ops.aten._unique2.default
        ef = sys.modules.get("torch._dynamo.eval_frame")
    '''))
    names = {name for _, name in _private_torch_names(bad)}
    assert {"torch.fx.experimental._config", "torch._subclasses.fake_tensor", "torch._C._autograd._get_sequence_nr",
            "torch.ops.aten._grouped_mm", "torch._dynamo.eval_frame"} <= names
    assert not any("_unique2" in n or "docstring" in n for n in names)
