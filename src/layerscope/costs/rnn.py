"""Recurrent layers run as one fused kernel (oneDNN on CPU, cuDNN/MIOpen on GPU).

Every 2-D weight matrix W [G, I] of a layer is applied once per time step per batch row, so
  MACs = T * B * sum(numel(W) for each 2-D weight)       (= T*B*(I*G + H*G) for one LSTM layer, G = 4H)
  FLOPs = 2*MACs + T * B * per-step cell arithmetic, per hidden unit per direction:
          LSTM: gate pre-activation adds 4 + bias adds 8 + 3 sigmoid + 2 tanh + c = f*c + i*g (3)
                + h = o*tanh(c) (1) = 21;  GRU: 3 + 6 + 2 sigmoid + 1 tanh + r*hn (1) + n add (1)
                + (1-z)*n + z*h (4) = 18;  RNN tanh/relu: 1 + 2 + 1 = 4
  backward: the real backward computes dX, dH (one product with each weight) and dW_ih, dW_hh (one
  product each): MACs = 2 * T * B * sum(numel(W)); FLOPs = 2*MACs + 2 * the cell arithmetic.
The unfused path (meta tensors, GRU on CPU) runs per-step mm/addmm and pointwise ops, counted by
their own formulas. Time steps come from the input, so cost scales with the sequence length.
"""

from __future__ import annotations

from ._util import numel, shape
from .matmul import contraction
from .registry import OpCall, OpCost, register

# cell arithmetic per hidden unit per direction per time step and batch row (see above)
CELL_FLOPS = {"RNN": 4, "LSTM": 21, "GRU": 18}
# mode codes shared by oneDNN and cuDNN: 0 RNN_RELU, 1 RNN_TANH, 2 LSTM, 3 GRU
_MODE = {0: "RNN", 1: "RNN", 2: "LSTM", 3: "GRU"}


def recurrent_cost(steps_batch: int, weight_numel: int, cell_units: int, cell: str,
                   backward: bool = False) -> OpCost:
    """A recurrent layer run over T * B = steps_batch rows: every weight matrix applied once per row
    (weight_numel: the elements of all its 2-D weights), plus the cell's arithmetic on cell_units =
    hidden * directions * layers (the aten kernels here and ONNX LSTM/GRU/RNN in costs/onnx.py)."""
    times = 2 if backward else 1
    return contraction(steps_batch * weight_numel * times, steps_batch * CELL_FLOPS[cell] * cell_units * times)


def _steps_batch(x, batch_first: bool, batch_sizes) -> int:
    if batch_sizes is not None and len(batch_sizes) > 0:   # packed sequence: sum of batch sizes
        return int(sum(int(b) for b in batch_sizes))
    s = shape(x)
    if len(s) == 2:                                         # unbatched [T, I]
        return s[0]
    return s[0] * s[1]


def _cost(weights, x, batch_first, batch_sizes, mode: int, hidden: int, backward: bool,
          directions: int = 1, layers: int = 1) -> OpCost:
    tb = _steps_batch(x, batch_first, batch_sizes)
    per_step = sum(numel(w) for w in weights if w is not None and w.dim() == 2)
    return recurrent_cost(tb, per_step, hidden * directions * layers, _MODE.get(int(mode), "RNN"), backward)


@register("mkldnn_rnn_layer")
def mkldnn_rnn_layer(c: OpCall) -> OpCost:
    return _cost(c.args[1:3], c.args[0], bool(c.arg("batch_first")), c.arg("batch_sizes"),
                 c.arg("mode"), int(c.arg("hidden_size")), False)


@register("mkldnn_rnn_layer_backward")
def mkldnn_rnn_layer_backward(c: OpCall) -> OpCost:
    return _cost(c.args[1:3], c.args[0], bool(c.arg("batch_first")), c.arg("batch_sizes"),
                 c.arg("mode"), int(c.arg("hidden_size")), True)


@register("_cudnn_rnn", "miopen_rnn")
def cudnn_rnn(c: OpCall) -> OpCost:
    return _cost(c.args[1], c.args[0], bool(c.arg("batch_first")), c.arg("batch_sizes"), c.arg("mode"),
                 int(c.arg("hidden_size")), False, 2 if c.arg("bidirectional") else 1,
                 int(c.arg("num_layers")))


@register("_cudnn_rnn_backward", "miopen_rnn_backward")
def cudnn_rnn_backward(c: OpCall) -> OpCost:
    return _cost(c.args[1], c.args[0], bool(c.arg("batch_first")), c.arg("batch_sizes"), c.arg("mode"),
                 int(c.arg("hidden_size")), True, 2 if c.arg("bidirectional") else 1,
                 int(c.arg("num_layers")))


@register("_thnn_fused_lstm_cell", "_thnn_fused_gru_cell")
def fused_cell(c: OpCall) -> OpCost:
    # gate pre-activations are already computed; the cell is pointwise per hidden unit.
    gates = c.args[0]
    return OpCost(0, numel(gates) * 2)


@register("_thnn_fused_lstm_cell_backward_impl", "_thnn_fused_gru_cell_backward")
def fused_cell_backward(c: OpCall) -> OpCost:
    return OpCost(0, numel(c.args[0]) * 4)
