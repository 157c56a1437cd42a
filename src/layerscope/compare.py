"""Deprecated alias, kept for one release: ``compare`` and its records live in
layerscope.reports.compare (``compare`` and ``Comparison`` are exported from ``layerscope``). Nothing
inside the package imports this module.

``layerscope.compare`` is also the function exported from the package root. Importing this module
makes the import system set the root's attribute ``compare`` to the module, so the module is made
callable (it calls the function): ``layerscope.compare(a, b)`` works either way."""

import sys
import types
import warnings

warnings.warn("the module layerscope.compare is deprecated; use the function layerscope.compare (and "
              "layerscope.Comparison)", DeprecationWarning, stacklevel=2)

from .reports.compare import ComparedLayer, Comparison, compare  # noqa: E402

__all__ = ["compare", "Comparison", "ComparedLayer"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
