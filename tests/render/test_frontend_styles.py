"""render.torchscan and render.modelsummary: the peers' layouts as styles, drawn from literal rows and
totals (no model, no torch), with every expected string written out by hand from the peers' format
rules (torchscan's summary, torchModelSummary's Statistics.__repr__). The front ends' whole printouts
are pinned by tests/compat/test_goldens_compat.py."""

import pytest

from layerscope.errors import InputError
from layerscope.render import modelsummary as ms
from layerscope.render import torchscan as ts
from layerscope.render.units import decimals, digits, modelsummary_mult_adds, torchscan_amount


def test_units_of_the_peers():
    assert decimals(0.25) == "0.25" and decimals(3.0, 0) == "3" and decimals(2.5e-3) == "0.00"
    assert digits(1_022) == "1022"
    # torchscan's unit_scale: 16,750 // 1e3 > 0 -> 16.75 k; 999 stays as it is; 2e9 -> 2.00 G
    assert torchscan_amount(16_750, "FLOPs") == "16.75 kFLOPs"
    assert torchscan_amount(999, "MACs") == "999.00 MACs"
    assert torchscan_amount(2e9, "DMAs") == "2.00 GDMAs"
    # torchModelSummary: G from 1e9 on (2 x 128 x 2048 x 2048 = 1,073,741,824 -> 1.07), else M
    assert modelsummary_mult_adds(1_073_741_824) == "(G): 1.07"
    assert modelsummary_mult_adds(999_999_999) == "(M): 1000.00"      # 999.999999 to two decimals
    assert modelsummary_mult_adds(62_248) == "(M): 0.06"


def test_torchscan_wrap_name():
    # "mid" keeps the last dotted part: "[...].conv" is 10 characters, so 12 - 10 = 2 of the start stay
    assert ts.wrap_name("backbone.layer.conv", 12, "mid") == "ba[...].conv"
    assert ts.wrap_name("backbone.layer.conv", 12, "end") == "backbon[...]"      # 12 - 5 = 7 kept
    assert ts.wrap_name("backbone.layer.conv", 12, None) == "backbone.layer.conv"
    assert ts.wrap_name("short", 12, "end") == "short"
    with pytest.raises(InputError, match="wrap_mode must be 'mid', 'end' or None, got 'both'"):
        ts.wrap_name("backbone.layer.conv", 12, "both")


def _torchscan_rows():
    return [ts.Row("net", 0, "Net", (-1, 4), 16, 10.0, 2.0, 1.0),
            ts.Row("fc", 1, "Linear", (-1, 4), 1_234, 10.0, 2.0, 1.0)]


def test_torchscan_table_widths_and_footer():
    totals = ts.Totals(trainable=1_000, frozen=250, model_mb=0.5, overhead_mb=0.25, flops=16_750, macs=999,
                       dmas=2e9)
    lines = ts.summary_text(_torchscan_rows(), totals).split("\n")
    # widths: the longest of header and cells, 4 columns: Layer 5 ("├─fc" is 4), Type 6 ("Linear"),
    # Output Shape 12, Param # 7 ("1,234" is 5); 5 + 6 + 12 + 7 + 3 margins of 4 = 42
    assert lines[0] == "_" * 42 and lines[2] == "=" * 42
    assert lines[1] == "Layer    Type      Output Shape    Param #"
    assert lines[3] == "net      Net       (-1, 4)         16     "
    assert lines[4] == "├─fc     Linear    (-1, 4)         1,234  "
    assert lines[5:] == ["=" * 42, "Trainable params: 1,000", "Non-trainable params: 250", "Total params: 1,250",
                         "-" * 42, "Model size (params + buffers): 0.50 Mb", "Framework & CUDA overhead: 0.25 Mb",
                         "Total RAM usage: 0.75 Mb", "-" * 42,
                         "Floating Point Operations on forward: 16.75 kFLOPs",
                         "Multiply-Accumulations on forward: 999.00 MACs",
                         "Direct memory accesses on forward: 2.00 GDMAs", "_" * 42]


def test_torchscan_receptive_field_columns():
    totals = ts.Totals(1, 0, 0.0, 0.0, 0, 0, 0)
    rf = ts.summary_text(_torchscan_rows(), totals, receptive_field=True).split("\n")
    # a fifth column, "Receptive field" (15 wide): 42 + 4 + 15 = 61
    assert rf[1] == "Layer    Type      Output Shape    Param #    Receptive field"
    assert rf[4] == "├─fc     Linear    (-1, 4)         1,234      10             "
    eff = ts.summary_text(_torchscan_rows(), totals, receptive_field=True, effective_rf_stats=True).split("\n")
    # two more: stride 16 wide, padding 17 wide: 61 + 4 + 16 + 4 + 17 = 102
    assert len(eff[0]) == 102 and eff[4].endswith("10                 2                   1                ")
    # effective_rf_stats alone shows nothing more (torchscan's rule)
    assert ts.summary_text(_torchscan_rows(), totals, effective_rf_stats=True).split("\n")[1] == (
        "Layer    Type      Output Shape    Param #")


def test_modelsummary_layer_line():
    line = ms.layer_line("Conv2d", 2, 1, [1, 3, 8, 8], [1, 4, 8, 8], 1_234, 0.5, 0.25, 0.001, 0.751)
    # a 40-wide name, indented 2 spaces per level below the first, then 30, 30, 30, 30, 35, 30, 30 right-aligned
    assert len(line) == 40 + 6 * 30 + 35
    assert line[:40] == "  Conv2d: 2-1" + " " * 27
    assert line[40:70] == f"{'[1, 3, 8, 8]':>30}" and line[100:130] == f"{'1,234':>30}"
    assert line[130:160].strip() == "0.50" and line[160:195] == " " * 31 + "0.25"
    assert line[195:].split() == ["0.00", "0.75"]


def test_modelsummary_footer_without_and_with_input():
    bare = ms.Totals(params=1_500, trainable=1_000, mult_adds=0, input_mb=0.0, output_mb=0.0, params_mb=0.0,
                     size_mb=0.0, with_input=False)
    # no rows: the rules are torchModelSummary's default 40 wide, no header, no mult-add lines
    assert ms.statistics_text([], bare) == ("=" * 40 + "\nTotal # of Params: 1500\nTrainable Params #: 1000\n"
                                            "Non Trainable Params #: 500\n" + "=" * 40)
    full = ms.Totals(params=1_500, trainable=1_500, mult_adds=1_073_741_824, input_mb=2.0, output_mb=18.01,
                     params_mb=16.01, size_mb=36.02, with_input=True)
    row = ms.layer_line("Linear", 1, 1, [2, 8], [2, 8], 72, 0.0, 0.0, 0.0, 0.0)
    text = ms.statistics_text([row], full).split("\n")
    assert text[0] == "=" * 255 and text[4] == "-" * 255
    assert text[5:10] == ["Total mult-adds (G): 1.07", "Input size (MB): 2.00", "Forward/backward pass size (MB): 18.01",
                          "Params size (MB): 16.01", "Estimated Total Size (MB): 36.02"]
    assert text[11].startswith("Layer Name (type)" + " " * 23) and text[11].endswith("Estimated Total Size (MB)")
    assert len(text[11]) == 255 and text[12] == row and text[13] == "=" * 255
