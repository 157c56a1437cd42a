"""layerscope.compat.torchinfo and layerscope.summary: torchinfo's arguments, attributes and layout
over layerscope's numbers (issue 21). Expected values are derived by hand in the comments."""

import pytest
import torch
from torch import nn

import layerscope as ls
from layerscope.compat.torchinfo import summary
from layerscope.render.units import torchinfo_number

from .models import LSTMNet, TinyResNet, same_state, state

# LSTMNet (vocab 20, embed 30, hidden 16, 2 layers), input (1, 10) token ids:
#   Embedding 20*30 = 600 params, no MACs (a lookup).
#   LSTM layer 0: W_ih 64x30 + W_hh 64x16 + 2 biases of 64 = 1,920 + 1,024 + 128 = 3,072;
#        layer 1: 64x16 + 64x16 + 128 = 2,176; together 5,248.
#        MACs per time step 4H(I+H): 64*(30+16) = 2,944 and 64*(16+16) = 2,048; x 10 steps = 49,920.
#   Linear 16*20 + 20 = 340 params; 10 positions x 16 x 20 = 3,200 MACs.
#   Totals: 6,188 params, 53,120 MACs (torchinfo's heuristic: params x positions, 376,832,000 in its
#   README for the full-size net).
LSTM_PARAMS, LSTM_MACS = 6_188, 53_120


def test_lstm_readme_example(capsys):
    m = LSTMNet()
    before = state(m)
    stats = summary(m, (1, 10), dtypes=[torch.long], verbose=2, col_width=16,
                    col_names=["kernel_size", "output_size", "num_params", "mult_adds"],
                    row_settings=["var_names"])
    out = capsys.readouterr().out
    assert out == str(stats) + "\n"
    assert same_state(before, state(m))
    assert (stats.total_params, stats.trainable_params, stats.total_mult_adds) == (LSTM_PARAMS, LSTM_PARAMS, LSTM_MACS)
    assert stats.total_input == 80                      # 10 int64 token ids
    assert stats.total_param_bytes == 4 * LSTM_PARAMS
    lines = out.splitlines()
    width = 40 + 4 * 16                                 # layer-name column + 4 columns of col_width
    assert lines[0] == "=" * width
    assert lines[1] == (f"{'Layer (type (var_name))':<40} {'Kernel Shape':<16} {'Output Shape':<16} "
                        f"{'Param #':<16} Mult-Adds")
    assert f"{'├─LSTM (encoder)':<40} {'--':<16} {'[1, 10, 16]':<16} {'5,248':<16} 49,920" in lines
    assert f"{'├─Linear (decoder)':<40} {'--':<16} {'[1, 10, 20]':<16} {'340':<16} 3,200" in lines
    assert f"{'├─Embedding (embedding)':<40} {'--':<16} {'[1, 10, 30]':<16} {'600':<16} --" in lines
    # verbose=2: one row per weight, kernel shape with in/out swapped as torchinfo shows it
    assert f"{'│    └─weight_ih_l0':<40} {'[64, 30]':<16} {'':<16} ├─1,920" in lines
    assert f"{'│    └─bias_hh_l1':<40} {'[64]':<16} {'':<16} └─64" in lines
    assert f"{'│    └─weight':<40} {'[16, 20]':<16} {'':<16} ├─320" in lines
    assert "Total params: 6,188" in lines and "Trainable params: 6,188" in lines
    assert "Non-trainable params: 0" in lines
    assert "Total mult-adds (M): 0.05" in lines         # 53,120 / 1e6
    assert "Input size (MB): 0.00" in lines and "Params size (MB): 0.02" in lines   # 24,752 B
    root = stats.summary_list[0]
    assert (root.class_name, root.var_name, root.depth, root.output_size) == ("LSTMNet", "LSTMNet", 0, [10, 20])
    lstm = stats.summary_list[2]
    assert (lstm.layer_id, lstm.module, lstm.depth_index, lstm.parent_info) == (id(m.encoder), m.encoder, 2, root)
    assert (lstm.num_params, lstm.macs, lstm.trainable, lstm.executed) == (5_248, 49_920, "True", True)


def _block_rows(text: str, stats, col: int) -> list[str]:
    """The cells of column ``col`` of every layer row of a printed summary."""
    f = stats.formatting
    lines = text.splitlines()
    start = lines.index(next(x for x in lines if x.startswith("Layer (type"))) + 2
    end = lines.index("=" * f.get_total_width(), start)
    a = f.layer_name_width + 1 + col * (f.col_width + 1)
    return [row[a:a + f.col_width].strip() for row in lines[start:end]]


# TinyResNet, input (1, 3, 8, 8), every conv 3x3 padding 1 without bias on 8x8 maps (64 positions):
#   conv1 3->4: 4*3*9 = 108 params, 4*64 outputs x 27 = 6,912 MACs
#   3 blocks x 2 convs 4->4: 144 params and 256 x 36 = 9,216 MACs each: 864 params, 55,296 MACs
#   fc 4->10: 50 params, 40 MACs.  Totals: 1,022 params, 62,248 MACs.
RESNET_PARAMS, RESNET_MACS = 1_022, 62_248


@pytest.mark.parametrize("depth", [-1, 1, 2])
def test_resnet_rows_add_up_to_the_totals(depth):
    # torchinfo's own invariant: the Param # and Mult-Adds cells shown add up to the totals
    stats = summary(TinyResNet(), (1, 3, 8, 8), depth=depth, col_names=("output_size", "num_params", "mult_adds"),
                    verbose=0)
    text = str(stats)
    assert (stats.total_params, stats.total_mult_adds) == (RESNET_PARAMS, RESNET_MACS)
    cells = lambda c: sum(int(v.strip("()").replace(",", "")) for v in _block_rows(text, stats, c)  # noqa: E731
                          if v not in ("--", "(recursive)"))
    assert cells(1) == RESNET_PARAMS and cells(2) == RESNET_MACS


def test_resnet_depth_index_and_tree(capsys):
    stats = summary(TinyResNet(), (1, 3, 8, 8), depth=3)
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("Layer (type:depth-idx)") and "Output Shape" in out[1] and "Param #" in out[1]
    names = [r[:stats.formatting.layer_name_width].rstrip() for r in out[3:3 + 21]]
    # depth-idx counts per depth over the whole model in call order (layer2's block is the 3rd at depth 2)
    assert names[:6] == ["TinyResNet", "├─Conv2d: 1-1", "├─ReLU: 1-2", "├─Sequential: 1-3", "│    └─Block: 2-1",
                         "│    │    └─Conv2d: 3-1"]
    assert "│    └─Block: 2-3" in names and "├─Linear: 1-5" in names
    # root, conv1, relu, layer1 + 2 x (block, conv, relu, conv, relu), layer2 + 1 x the same, fc
    assert len(stats.summary_list) == 3 + 1 + 10 + 1 + 5 + 1 == 21


def test_step_memory_is_simulated_not_guessed():
    # Linear(4, 3, bias=False) on x (2, 4) float32, one forward + backward of output.sum():
    #   parameters 12 x 4 = 48 B, input 8 x 4 = 32 B, output (2, 3) = 24 B, loss scalar 4 B,
    #   its gradient seed 4 B, weight gradient 48 B, and inside the weight-gradient mm the kernel
    #   makes the expanded (stride-0) output gradient contiguous: 2 x 3 x 4 = 24 B of scratch.
    #   Peak during backward 48+32+24+4+4+48+24 = 184 B; the CPU allocator's own events of the real
    #   step (memory(measure=True)) give 184 B too. Forward/backward pass size = 184 - 48 - 32 = 104 B
    #   (torchinfo: 2 x output = 48 B).
    stats = summary(nn.Linear(4, 3, bias=False), input_data=torch.randn(2, 4), verbose=0)
    assert (stats.estimated_total_size, stats.total_output_bytes, stats.memory_basis) == (184, 104, "forward+backward step")
    assert "Forward/backward pass size (MB): 0.00" in str(stats)


def test_no_input_prints_the_parameter_table(capsys):
    m = TinyResNet()
    stats = summary(m)
    out = capsys.readouterr().out
    assert "Layer (type:depth-idx)" in out and "Param #" in out and "Output Shape" not in out
    assert "Total params: 1,022" in out and "mult-adds" not in out
    assert f"{'├─Conv2d: 1-1':<40} 108" in out.splitlines()
    assert not any(i.executed for i in stats.summary_list) and stats.total_params == RESNET_PARAMS
    with pytest.raises(ls.InputError, match="needs input_size or input_data"):
        summary(m, col_names=["output_size"])


class TwoInputs(nn.Module):
    """torchinfo's MultipleInputNetDifferentDtypes, shrunk: a float input and a long input."""

    def __init__(self):
        super().__init__()
        self.fc1a = nn.Linear(30, 5)
        self.fc1b = nn.Linear(30, 5)

    def forward(self, x, y):
        return self.fc1a(x) + self.fc1b(y.float())


def test_dtypes_as_tensor_types_as_torchinfos_tests_pass_them():
    # 2 x (1 x 30 x 5) MACs = 300; inputs 30 x 4 B + 30 x 8 B = 360 B
    stats = summary(TwoInputs(), [(1, 30), (1, 30)], dtypes=[torch.FloatTensor, torch.LongTensor], verbose=0)
    assert (stats.total_mult_adds, stats.total_input, stats.input_size) == (300, 360, [(1, 30), (1, 30)])
    with pytest.raises(ls.InputError, match="dtypes takes"):
        summary(TwoInputs(), [(1, 30), (1, 30)], dtypes=["float"], verbose=0)


class NeedsFlag(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x, scale=1.0):
        return self.fc(x) * scale


def test_torchinfo_arguments_never_reach_forward():
    # regression (issue 21): row_settings=, col_width=, cache_forward_pass= went to forward
    m = NeedsFlag()
    for fn in (summary, ls.summary):
        stats = fn(m, input_data=torch.randn(2, 4), row_settings=["ascii_only"], col_width=10,
                   cache_forward_pass=True, verbose=0, scale=2.0)
        assert stats.total_mult_adds == 2 * 4 * 4
    # row_settings replaces the default ("depth"), as in torchinfo
    assert "\n+ Linear " in str(summary(m, (2, 4), row_settings=["ascii_only"], verbose=0))
    assert "\n+ Linear: 1-1 " in str(summary(m, (2, 4), row_settings=["ascii_only", "depth"], verbose=0))
    stats = ls.summary(TinyResNet(), input_size=(1, 3, 8, 8), receptive_field=True, verbose=0)
    assert stats.total_mult_adds == RESNET_MACS


def test_ls_summary_is_a_report_with_torchinfo_attributes(capsys):
    m = TinyResNet()
    stats = ls.summary(m, input_size=(1, 3, 8, 8), col_names=("output_size", "num_params", "mult_adds"),
                       depth=2, verbose=0)
    assert capsys.readouterr().out == ""
    assert isinstance(stats, ls.Report) and stats.totals.macs == RESNET_MACS == stats.total_mult_adds
    assert (stats.total_params, stats.trainable_params) == (RESNET_PARAMS, RESNET_PARAMS)
    assert stats.summary_list[1].class_name == "Conv2d" and stats.module("layer1") is m.layer1
    text = str(stats)                       # regression: print() ignored col_names and depth
    assert "Mult-Adds" in text and "│    └─Block: 2-1" in text and "Conv2d: 3-1" not in text
    everything = str(ls.summary(m, input_size=(1, 3, 8, 8), depth=-1, verbose=0))   # regression: empty table
    assert "│    │    └─Conv2d: 3-1" in everything
    stack = nn.Sequential(*[nn.Linear(4, 4) for _ in range(4)])
    ls.summary(stack, input_size=(1, 4), verbose=1)
    assert "0-3: Linear x4" in capsys.readouterr().out
    ls.summary(stack, input_size=(1, 4), verbose=2)   # regression: looked like 1; now every block unfolded
    assert "3: Linear" in capsys.readouterr().out
    ls.summary(m)                           # regression: no input failed; now the parameter table
    assert "Total params: 1,022" in capsys.readouterr().out


def test_verbose_two_shows_weights_and_verbose_one_does_not():
    m = nn.Sequential(nn.Linear(3, 2))
    one, two = (str(summary(m, (1, 3), verbose=v)) for v in (0, 2))
    assert "└─weight" not in one and "└─bias" in two and "├─6" in two


def test_recursive_module_rows():
    # the same Linear called twice: its second row is "(recursive)" and its params count once
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 3)

        def forward(self, x):
            return self.fc(self.fc(x))

    stats = summary(Twice(), (1, 3), verbose=0)
    assert [i.is_recursive for i in stats.summary_list] == [False, False, True]
    assert stats.total_params == 12 and stats.total_mult_adds == 18    # 2 calls x 3 x 3
    assert "(recursive)" in str(stats)
    assert "(recursive)" not in str(summary(Twice(), (1, 3), verbose=0, row_settings=["hide_recursive_layers"]))


@pytest.mark.parametrize("kwargs, match", [
    (dict(col_names=["bogus"]), "unknown column"),
    (dict(row_settings=["bogus"]), "unknown row setting"),
    (dict(verbose=3), "verbose must be"),
    (dict(mode="test"), "mode must be"),
    (dict(col_width=0), "col_width"),
    (dict(input_data=torch.randn(1, 3)), "either input_size or input_data"),
])
def test_bad_arguments_are_one_line_errors(kwargs, match):
    m = nn.Linear(3, 3)
    before = state(m)
    with pytest.raises(ls.InputError, match=match) as e:
        summary(m, (1, 3), **kwargs) if "input_data" not in kwargs else summary(m, (1, 3), verbose=0, **kwargs)
    assert "\n" not in str(e.value) and same_state(before, state(m))


def test_number_format_matches_torchinfo():
    assert torchinfo_number(3_784_580, auto=False) == ": 3,784,580"
    assert torchinfo_number(376_832_000, auto=True) == " (M): 376.83"
    assert torchinfo_number(2_000_000_000, auto=True) == " (G): 2"


class ArgMax(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x).argmax(-1)


def test_step_memory_falls_back_to_forward_only_and_says_so():
    # integer output: nothing to differentiate, so the forward alone is simulated:
    #   parameters (9 + 3) x 4 = 48 B, input (2, 3) float32 24 B, fc output 24 B, argmax (2,) int64
    #   16 B written while the fc output lives: peak 48 + 24 + 24 + 16 = 112 B
    stats = summary(ArgMax(), (2, 3), verbose=0)
    assert (stats.memory_basis, stats.estimated_total_size, stats.total_output_bytes) == ("forward only", 112, 40)
    assert "requires grad" in stats.memory_error


def test_failing_forward_is_one_line_and_leaves_the_model():
    m = nn.Linear(3, 3)
    before = state(m)
    with pytest.raises(ls.ForwardError) as e:
        summary(m, (1, 5), verbose=0)
    assert "\n" not in str(e.value) and "Linear" in str(e.value) and same_state(before, state(m))


class ContainerChildModule(nn.Module):
    def __init__(self):
        super().__init__()
        self._sequential = nn.Sequential(nn.Linear(5, 5), nn.Linear(5, 5))
        self._between = nn.Linear(5, 5)

    def forward(self, x):
        out = self._sequential(x)
        out = self._between(out)
        for layer in self._sequential:
            out = layer(out)
        out = self._sequential(x)
        for layer in self._sequential:
            out = layer(out)
        return out


class ContainerModule(nn.Module):
    """torchinfo README's ModuleList example."""

    def __init__(self):
        super().__init__()
        self._layers = nn.ModuleList([nn.Linear(5, 5), ContainerChildModule(), nn.Linear(5, 5)])

    def forward(self, x):
        for layer in self._layers:
            x = layer(x)
        return x


def test_container_readme_example():
    # 5 Linear(5, 5) of 30 params: 150; Linear calls: 2 top-level + 9 in the child (2 + 1 + 2 + 2 + 2)
    # = 11 x 25 MACs = 275 (torchinfo README: the same 11 Linear rows)
    stats = summary(ContainerModule(), (1, 5), col_names=("output_size", "num_params", "mult_adds"), verbose=0)
    assert (stats.total_params, stats.total_mult_adds) == (150, 275)
    rows = [(i.class_name, i.depth, i.is_recursive) for i in stats.summary_list]
    # one row per call, at its module's depth in the tree, and torchinfo's rows for the containers that
    # never ran themselves: the ModuleList above its members, the Sequential again above the layers the
    # child's loop calls without it (a repeat: its parameters counted once), as its README's 17 rows
    assert len(rows) == 17 and rows[1] == ("ModuleList", 1, False) and rows[4] == ("Sequential", 3, False)
    assert rows[8] == ("Sequential", 3, True) and sum(r[2] for r in rows) == 8
    text = str(stats)
    assert "│    │    └─Sequential: 3-3              --" in text and "Total params: 150" in text
    # at the depth limit (3) each row shows its subtree's MACs, the layers its loops call included:
    # 25 + 50 + 25 + 50 + (50 + 50) + 25 = 275, the total
    shown = [i for i in stats.summary_list if i.depth <= 3]
    assert sum(i.macs if i.depth == 3 or i.is_leaf_layer else i.self_macs for i in shown) == 275


def test_report_methods_without_a_forward_say_so():
    stats = summary(nn.Linear(3, 3), verbose=0)
    with pytest.raises(ls.InputError, match="no forward ran"):
        stats.table()
    assert stats.total_params == 12


def test_batch_dim():
    # input_size without the batch dimension: a batch of 1 is inserted, and shown (a tensor output's
    # shape as it ran, as torchinfo 1.8 prints it); 1 x 3 x 2 = 6 MACs
    stats = summary(nn.Linear(3, 2), (3,), batch_dim=0, verbose=0)
    assert (stats.input_size, stats.total_mult_adds, stats.summary_list[0].output_size) == ([(3,)], 6, [1, 2])
    # with input_data, batch_dim changes nothing shown; 4 x 3 x 2 = 24 MACs
    stats = summary(nn.Linear(3, 2), input_data=torch.randn(4, 3), batch_dim=0, verbose=0)
    assert (stats.total_mult_adds, stats.summary_list[0].output_size) == (24, [4, 2])


def test_ls_summary_takes_layerscope_and_torchinfo_columns_and_refuses_others():
    stats = ls.summary(nn.Linear(3, 2), input_size=(1, 3), col_names=("flops", "groups", "mult_adds"), verbose=0)
    assert stats.formatting.col_names == ("groups", "mult_adds") and stats.totals.flops == 2 * 6 + 2
    with pytest.raises(ls.InputError, match="unknown column 'bogus'"):
        ls.summary(nn.Linear(3, 2), input_size=(1, 3), col_names=("bogus",), verbose=0)


class _ReadmeLSTMNet(nn.Module):
    """torchinfo's README example: Embedding(20, 300), a 2-layer LSTM of 512, Linear(512, 20), returning
    the logits and the LSTM's state (3,784,580 parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(20, 300)
        self.encoder = nn.LSTM(300, 512, num_layers=2, batch_first=True)
        self.decoder = nn.Linear(512, 20)

    def forward(self, x):
        out, hidden = self.encoder(self.embedding(x))
        out = self.decoder(out)
        return out.view(-1, out.size(2)), hidden


def test_compat_doc_quotes_what_the_front_end_prints():
    """docs/compat.md's figures for torchinfo's README LSTMNet are the ones summary() prints (they had
    drifted: the doc said 15.79 MB where the front end printed 33.69). MACs by hand: the LSTM's two
    layers, 100 steps, 4 gates of 512: 100 x 4 x 512 x (300 + 512) + 100 x 4 x 512 x (512 + 512) =
    166,297,600 + 209,715,200 = 376,012,800; the Linear 100 x 512 x 20 = 1,024,000; 377,036,800."""
    import pathlib
    import re
    torch.manual_seed(0)
    stats = summary(_ReadmeLSTMNet(), (1, 100), dtypes=[torch.long], verbose=0)
    assert (stats.total_params, stats.total_mult_adds) == (3_784_580, 377_036_800)
    text = str(stats)
    fwd = re.search(r"Forward/backward pass size \(MB\): ([\d.]+)", text).group(1)
    total = re.search(r"Estimated Total Size \(MB\): ([\d.]+)", text).group(1)
    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "compat.md").read_text()
    assert "377,036,800 = LSTM 376,012,800 + Linear 1,024,000" in doc
    assert f"(README LSTMNet: {fwd} MB)" in doc and f"the simulated step peak itself ({total} MB)" in doc


def _column_sum(text: str, title: str) -> int:
    """The sum of a printed column (torchinfo's own test helper reads it the same way)."""
    table = text.replace("=", "").split("\n\n")
    at = table[0].strip().find(title)
    total = 0
    for line in table[1].split("\n"):
        cell = line[at:].split(" ")[0]
        if cell and cell not in ("--", "(recursive)") and not cell.startswith(("└─", "├─")):
            total += int(cell.replace(",", "").strip("()"))
    return total


class _Interleaved(nn.Module):          # list members called between calls of another module
    def __init__(self):
        super().__init__()
        self.l = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.m = nn.Linear(4, 4)

    def forward(self, x):
        for layer in self.l:
            x = self.m(layer(x))
        return x


class _Holder(nn.Module):
    def __init__(self):
        super().__init__()
        self.sub, self.other = nn.Linear(4, 4), nn.Linear(4, 4)
        self.list = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x):
        return self.list[0](self.other(x))


class _FromOutside(nn.Module):          # members called by the root, before and after their holder
    def __init__(self):
        super().__init__()
        self.a = _Holder()
        self.b = nn.Linear(4, 4)
        self.b.weight = self.a.sub.weight   # tied

    def forward(self, x):
        x = self.a(self.a.sub(x))
        return self.b(self.a.list[1](x))


@pytest.mark.parametrize("model, params, macs", [
    # 4 Linear(4, 4) of 20: 80; 6 calls of 2 x 4 x 4 = 32 MACs: 192
    (_Interleaved, 80, 192),
    # 5 Linear(4, 4) (sub, other, list[0], list[1], b), b's weight tied to sub's: 5 x 20 - 16 = 84;
    # 5 calls of 32 MACs: 160
    (_FromOutside, 84, 160),
])
def test_columns_add_up_whatever_the_calls_order(model, params, macs):
    """Each parameter on one row and each call's MACs once, at every depth: members called in
    interleaved order, a member called before its holder runs, one called by the root from inside
    another's container, and a tied weight (a reviewer's cases)."""
    torch.manual_seed(0)
    m = model()
    before = state(m)
    for depth in (1, 2, 3, -1):
        stats = summary(m, input_size=(2, 4), depth=depth, col_names=("num_params", "mult_adds"), verbose=0)
        assert (stats.total_params, stats.total_mult_adds) == (params, macs)
        text = str(stats)
        assert (_column_sum(text, "Param #"), _column_sum(text, "Mult-Adds")) == (params, macs), depth
    assert same_state(before, state(m))


def test_pruned_parameters_count_their_mask_once_shared_or_not():
    """A pruned weight counts as its mask's ones (torchinfo's convention), whichever name of a shared
    tensor the pruning used; an x_orig beside an x_mask of the user's own is no pruning."""
    from torch.nn.utils import prune
    torch.manual_seed(0)
    emb, head = nn.Embedding(10, 4), nn.Linear(4, 10, bias=False)
    prune.l1_unstructured(head, "weight", 0.5)     # 40 elements, 20 kept
    emb.weight = head.weight_orig                   # the same tensor under another name
    model = nn.ModuleDict({"emb": emb, "head": head})
    before, rng = state(model), torch.get_rng_state()
    stats = summary(model, verbose=0)
    assert stats.total_params == 20
    # with a forward too (the head alone, 2 x 4 x 10 = 80 MACs of the dense kernel); the model, its
    # pruning hook and mask, mode, requires_grad and the RNG come out as they went in
    assert summary(head, input_size=(2, 4), verbose=0).total_mult_adds == 80
    assert same_state(before, state(model)) and torch.equal(rng, torch.get_rng_state())

    class Own(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale_orig = nn.Parameter(torch.ones(3))
            self.register_buffer("scale_mask", torch.tensor([1.0, 0.0, 0.0]))
    assert summary(Own(), verbose=0).total_params == 3


# ---- torchinfo's Output Shape of a structure (its reduction of a dict, a tuple, an array) ----------------

class _ReturnsDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 2)

    def forward(self, x):
        h = self.a(x)
        return {"hidden": h, "out": self.b(h)}


class _ReturnsTuple(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):                       # x (5, 1, 3): flattened to (5, 2), then the input
        return self.fc(x).view(-1, 2), x


class _ReturnsArray(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc(torch.from_numpy(x)).detach().numpy()


def test_output_shape_of_a_structure_is_torchinfos():
    """The root's Output Shape when the model returns a structure, as torchinfo 1.8 computes it (only
    the display: the MACs and the bytes stay layerscope's)."""
    m = _ReturnsDict()
    before = state(m)
    # a dict: its last value's shape, (2, 3) -> a -> (2, 4) -> b -> (2, 2): [2, 2] (the first tensor, a's
    # (2, 4), was shown before); MACs 2 x 3 x 4 + 2 x 4 x 2 = 40
    stats = summary(m, input_size=(2, 3), verbose=0)
    assert (stats.summary_list[0].output_size, stats.total_mult_adds) == ([2, 2], 40)
    # with batch_dim 0 (input (1, 3) built from (3,)): the batch entry set to 1, inside a list, printed
    # [[1, 2]]; the Linear rows keep their tensors' shapes, [1, 4] and [1, 2]
    stats = summary(m, input_size=(3,), batch_dim=0, verbose=0)
    assert [r.output_size for r in stats.summary_list] == [[[1, 2]], [1, 4], [1, 2]]
    assert "_ReturnsDict                             [[1, 2]]" in str(stats)
    assert same_state(before, state(m))
    # a tuple under batch_dim: its first tensor's shape, the entry at batch_dim set to 1: the input
    # (5, 3) with a batch of 1 inserted at 1 is (5, 1, 3), fc gives (5, 1, 2), viewed as (5, 2) -> [5, 1];
    # without batch_dim the shape as it ran, [5, 2]. MACs 5 x 3 x 2 = 30 either way
    stats = summary(_ReturnsTuple(), input_size=(5, 3), batch_dim=1, verbose=0)
    assert [r.output_size for r in stats.summary_list] == [[5, 1], [5, 1, 2]] and stats.total_mult_adds == 30
    stats = summary(_ReturnsTuple(), input_data=torch.randn(5, 1, 3), verbose=0)
    assert stats.summary_list[0].output_size == [5, 2] and stats.total_mult_adds == 30


def test_output_shape_of_a_numpy_array():
    np = pytest.importorskip("numpy")
    # the array's shape: (4, 3) -> fc -> (4, 2), returned as an array: [4, 2] (no tensor: -- before)
    stats = summary(_ReturnsArray(), input_data=np.ones((4, 3), dtype=np.float32), verbose=0)
    assert [r.output_size for r in stats.summary_list] == [[4, 2], [4, 2]]


def test_layerscope_summary_keeps_the_shapes_that_ran():
    """layerscope.summary's ModelStatistics shows the first output tensor's shape, whatever the
    structure: a's (2, 4) for the dict of _ReturnsDict."""
    stats = ls.summary(_ReturnsDict(), input_size=(2, 3), verbose=0)
    assert stats.summary_list[0].output_size == [2, 4]


class _Passes(nn.Module):
    def forward(self, x):
        return x


class _ReturnsOther(nn.Module):
    def __init__(self, what):
        super().__init__()
        self.fc, self.inner, self.what = nn.Linear(3, 3), _Passes(), what

    def forward(self, x):
        return self.inner(self.what if self.what is not None else self.fc(x))


@pytest.mark.parametrize("what, said", [("text", "returned str 'text'"),
                                        (nn.Linear, "returned the class Linear")])
def test_a_layer_returning_no_tensor_structure_is_torchinfos_runtime_error(what, said):
    """torchinfo raises RuntimeError when a layer's output is not a tensor, an array, a list, a tuple,
    a dict or None (its own test_incorrect_model_forward): so does its front end, in one line naming
    the layer; the model comes out as it went in (its hooks too)."""
    m = _ReturnsOther(what)
    before = state(m)
    with pytest.raises(RuntimeError) as e:
        summary(m, input_size=(1, 3), verbose=0)
    msg = str(e.value)
    assert isinstance(e.value, ls.InputError) and "\n" not in msg
    assert msg.startswith(f"layer inner {said}: torchinfo's summary shows") and same_state(before, state(m))
    # layerscope's own summary does describe it (the layer ran): no output tensor, no shape
    assert ls.summary(m, input_size=(1, 3), verbose=0).summary_list[-1].output_size == []
    assert same_state(before, state(m))


def test_scripted_model_shows_the_shapes_that_ran():
    """torchinfo prints -- for a scripted model's shapes (its hooks do not run inside TorchScript);
    the front end shows those that ran (docs/compat.md: test_jit). Linear(3, 2) on (4, 3): [4, 2]."""
    stats = summary(torch.jit.script(nn.Sequential(nn.Linear(3, 2))), input_data=torch.randn(4, 3), verbose=0)
    assert stats.summary_list[0].output_size == [4, 2]


class _ParameterListModel(nn.Module):
    """torchinfo's tests/fixtures/models.py ParameterListModel: 30,000 parameters the forward never uses
    (held here by the root itself: the root's own-params column leaves out a ParameterList's, which this
    suite's sum invariant, tests/conftest.py, refuses; a separate matter)."""

    def __init__(self):
        super().__init__()
        self.weights = nn.Parameter(torch.zeros(100, 300))

    def forward(self, x):
        _ = self.weights
        return x


def test_estimated_total_size_holds_what_a_forward_that_runs_no_op_keeps():
    """Issue 58 item 7, torchinfo's test_parameter_list: the model returns its input, no op runs, and the
    forward-only simulation's peak came out 0: "Estimated Total Size (MB): 0.00" under "Params size (MB):
    0.12". What is resident is the peak: 30,000 float32 parameters, 120,000 B, and the (100, 100) input,
    40,000 B: 160,000 B, 0.16 MB (torchinfo 1.8: input + forward/backward + params, 0.04 + 0.00 + its
    own 0.00 for a ParameterList). The zero total prints as torchinfo 1.8 prints it: "Total mult-adds (M): 0"."""
    stats = summary(_ParameterListModel(), input_size=(100, 100), verbose=0)
    text = str(stats)
    assert stats.memory_basis == "forward only" and stats.estimated_total_size == 160_000
    for line in ("Total mult-adds (M): 0\n", "Input size (MB): 0.04\n", "Forward/backward pass size (MB): 0.00\n",
                 "Params size (MB): 0.12\n", "Estimated Total Size (MB): 0.16\n"):
        assert line in text, text
