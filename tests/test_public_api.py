import pytest
import torch

import layerscope


def test_all_names_exist_and_are_public():
    for name in layerscope.__all__:
        assert hasattr(layerscope, name), name
    assert {"analyze", "summary", "activations", "Report", "LayerscopeError"} <= set(layerscope.__all__)
    assert all(issubclass(getattr(layerscope, n), layerscope.LayerscopeError)
               for n in ("InputError", "ForwardError", "SpecError", "RegistryError"))


def test_all_is_sorted_and_complete():
    # every public name the package root binds (its submodules aside) is exported, once, in order
    import types
    public = {n for n, v in vars(layerscope).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    assert layerscope.__all__ == sorted(set(layerscope.__all__))
    assert public <= set(layerscope.__all__)


def test_old_module_paths_warn_and_still_work(monkeypatch):
    # issue 32: the shims are aliases kept for one release, imported by nothing inside the package
    import importlib
    import subprocess
    import sys
    code = ("import sys, warnings; warnings.simplefilter('error'); import layerscope; "
            "print(sorted(m for m in ('layerscope.report', 'layerscope.memory_report', 'layerscope.latency_report', "
            "'layerscope.compare') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    # the imports below bind module attributes on the root; monkeypatch puts everything back
    monkeypatch.setattr(layerscope, "compare", layerscope.compare)
    for name, attr, home in (("layerscope.report", "Report", "layerscope.render.views"),
                             ("layerscope.memory_report", "MemoryReport", "layerscope.render.views"),
                             ("layerscope.latency_report", "LatencyReport", "layerscope.render.views"),
                             ("layerscope.compare", "Comparison", "layerscope.render.views")):
        monkeypatch.delitem(sys.modules, name, raising=False)
        with pytest.warns(DeprecationWarning, match=name.replace(".", r"\.")):
            mod = importlib.import_module(name)
        assert getattr(mod, attr) is getattr(importlib.import_module(home), attr)
    # importing the module layerscope.compare rebinds the root's `compare`: it still compares
    from layerscope import compare
    a = layerscope.analyze(torch.nn.Linear(3, 2), torch.randn(1, 3))
    assert callable(compare)
    assert compare(a, a).to_dict() == importlib.import_module("layerscope.render.views").compare(a, a).to_dict()


def test_no_entry_point_takes_more_than_12_parameters():
    # issue 32: f(model, *args, <the few options most calls use>, options=None, **kwargs), *args and
    # **kwargs counted. summary() is torchinfo.summary's drop-in: it keeps torchinfo's own parameters
    # (a user swaps one import), so it is the one function held to its peer's signature instead.
    import inspect

    from layerscope.torchrun import launch
    funcs = {n: getattr(layerscope, n) for n in layerscope.__all__ if inspect.isfunction(getattr(layerscope, n))}
    funcs["launch"] = launch
    over = {n: len(inspect.signature(f).parameters) for n, f in funcs.items()
            if n != "summary" and len(inspect.signature(f).parameters) > 12}
    assert over == {}
    assert "options" in inspect.signature(launch).parameters
