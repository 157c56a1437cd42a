"""torchinfo's ``summary()`` with layerscope's numbers underneath.

    from layerscope.compat.torchinfo import summary      # was: from torchinfo import summary
    stats = summary(model, (1, 3, 224, 224), col_names=["input_size", "output_size", "num_params",
                    "mult_adds"], depth=2, row_settings=["var_names"], verbose=0)
    stats.total_params, stats.total_mult_adds, stats.summary_list[3].output_size
    print(stats)                                           # torchinfo's layout

The arguments, their defaults, the returned ``ModelStatistics`` attributes and the printed layout
follow torchinfo (1.8: the "(MB)" footer its README shows). The numbers come from
``layerscope.analyze`` and differ from torchinfo's where torchinfo guesses (see docs/compat.md):

- ``total_mult_adds`` and each row's Mult-Adds are the MACs of the ops that really ran (aten level),
  not ``params x output positions``; an embedding lookup has no MACs, an LSTM counts its matmuls.
  A container shows the MACs of the ops it ran itself (functional matmuls, attention), so the rows
  shown add up to the total; torchinfo shows ``--`` and leaves those out of its total.
- "Forward/backward pass size" is the peak of a simulated forward + backward step (no optimizer)
  minus the parameters and the inputs: activations kept for backward, gradients and temporaries,
  instead of ``2 x output bytes of layers with parameters``. "Estimated Total Size" is then the
  simulated peak itself. If that simulation cannot run (e.g. integer outputs, nothing to
  differentiate), a forward-only simulation is used and ``memory_basis`` says so.
- ``depth=-1`` shows every depth (torchinfo prints an empty table); ``cache_forward_pass`` is
  accepted and has no effect (layerscope keeps no global cache); the model is never moved:
  ``device`` only places inputs built from ``input_size`` and must match the model's device.
- Modules that were never called (an unused branch) have no row; a container that never ran itself
  (a ModuleList) gets a row above its members, as in torchinfo; a module called twice has a
  ``(recursive)`` row per later call, as in torchinfo.
- Output shapes are torchinfo's: a layer returning a dict, tuple or NumPy array shows torchinfo's
  reduction of it to one shape, and one returning a string or a class raises its RuntimeError; a
  scripted model shows the shapes that ran (torchinfo: ``--``, its hooks do not run in TorchScript).

The package has torchinfo's modules too, so that code importing them works after the swap:
``enums`` (ColumnSettings, RowSettings, Mode, Units, Verbosity), ``formatting`` (HEADER_TITLES,
FormattingOptions), ``model_statistics`` (ModelStatistics), ``layer_info`` (LayerInfo) and
``torchinfo`` (summary).
"""

from .enums import ColumnSettings, Mode, RowSettings, Units, Verbosity
from .layer_info import LayerInfo
from .torchinfo import (COLUMN_NAMES, ROW_SETTINGS, FormattingOptions, ModelStatistics, layerscope_summary,
                        summary)

__all__ = ["summary", "layerscope_summary", "ModelStatistics", "LayerInfo", "FormattingOptions", "COLUMN_NAMES",
           "ROW_SETTINGS", "ColumnSettings", "Mode", "RowSettings", "Units", "Verbosity"]
__version__ = "1.8.0"      # the torchinfo whose interface this follows
