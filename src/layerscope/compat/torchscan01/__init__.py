"""torchscan 0.1's ``crawl_module`` and ``summary`` (torch-scan 0.1.x, the version the seed was written
against) with layerscope's numbers; ``layerscope.compat.torchscan`` is 0.2's (what pip installs).
Laid out as torchscan 0.1.2's package: ``crawler`` (``crawl_module``, ``summary``, ``apply``),
``utils`` (``format_info``, ``aggregate_info``, ``format_name``, ``wrap_string``, ``unit_scale``),
``modules`` (``module_flops``, ``module_macs``, ``module_dmas``, ``module_rf``: layerscope's counts of one
module's forward on the given input) and ``process`` (``get_process_gpu_ram``).

    from layerscope.compat.torchscan01 import summary, crawl_module
    summary(model, (3, 224, 224), receptive_field=True, max_depth=1)
    info = crawl_module(model, (3, 224, 224))      # {"overheads": ..., "layers": [...], "overall": ...}

Same arguments (``input_shape`` without the batch dimension: a batch of 1 is added), the same dict
keys per layer (name, depth, type, input_shape, output_shape, grad_params, nograd_params,
param_size, num_buffers, buffer_size, flops, macs, dmas, rf, s, p, is_shared, is_leaf) and the same
printed layout. Where the numbers differ (docs/compat.md): every module call is counted from the
aten ops it ran, containers included (torchscan gives containers 0 and misses functional ops), so
the layers add up to the totals; a module holding parameters next to its children keeps them
(torchscan drops them); ``dmas`` is layerscope's bytes read + written divided by the model's
floating-point element size (torchscan's own formula per module type); ``rf``/``s``/``p`` are
layerscope's receptive field of each call's output w.r.t. the input (first spatial dim; torchscan
chains every layer in call order, branches included), carried over from the last layer that had
one; the CUDA and framework overheads are 0 (layerscope does not read process memory here: use
``layerscope.memory``).
"""

from . import crawler, modules, process, utils
from .crawler import crawl_module, summary
from .utils import aggregate_info, format_info

__all__ = ["crawl_module", "summary", "aggregate_info", "format_info", "crawler", "modules", "process", "utils"]
