"""torchscan 0.2 (what ``pip install torchscan`` installs) with layerscope's numbers:

    from layerscope.compat.torchscan import crawl_module, summary     # was: from torchscan import ...
    report = crawl_module(model, (3, 224, 224))     # AnalysisReport: context, inputs, layers, totals, ...
    summary(model, args=(x,), kwargs={"mask": m})

The modules torchscan 0.2 has: ``crawler`` (crawl_module, summary), ``report`` (the contract),
``flops`` (measure_flops), ``compare`` (compare_reports), ``utils``, ``modules`` (module_flops,
module_macs, module_dmas, module_rf) and ``process`` (measure_peak_memory). torchscan 0.1's API is
``layerscope.compat.torchscan01``. docs/compat.md lists where the numbers differ and why.
"""

from . import modules, process, utils  # noqa: F401
from .compare import *  # noqa: F401,F403
from .crawler import *  # noqa: F401,F403
from .flops import *  # noqa: F401,F403
from .report import *  # noqa: F401,F403

__version__ = "0.2.0"
