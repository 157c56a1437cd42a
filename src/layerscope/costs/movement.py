"""Data movement, creation and free ops.

Movement (copies, concatenation, padding, indexing): 0 FLOPs; bytes moved as the default rule says,
except gathers (embedding, index, index_select, gather), which read the indices and the rows they pick
(numel(out) elements), not the whole source. Scatter-adds count 1 FLOP per source element.
Creation (zeros, arange, rand, ...): 0 FLOPs, nothing read, the output written.
Free (views, reshapes, expands, transposes, detach, metadata, uninitialised allocation): nothing.
"""

from __future__ import annotations

import torch

from ._util import nbytes, numel, tensors_in
from .registry import OpCall, OpCost, register, register_free


def move(c) -> OpCost:
    """Data movement (aten copies and ONNX Transpose, Concat, Gather, ...): no arithmetic; bytes by
    the default rule."""
    return OpCost(0, 0)


def _movement(*names: str) -> None:
    register(*names)(move)


_movement(
    "clone", "copy_", "_to_copy", "_copy_from", "_copy_from_and_resize", "cat", "stack", "hstack",
    "vstack", "flip", "roll", "repeat", "repeat_interleave", "constant_pad_nd", "reflection_pad1d",
    "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d",
    "replication_pad3d", "tril", "tril_", "triu", "triu_", "lift_fresh_copy", "slice_scatter",
    "select_scatter", "diagonal_scatter", "as_strided_scatter", "masked_scatter", "masked_select",
    "nonzero", "_unique2", "pixel_shuffle", "pixel_unshuffle", "channel_shuffle",
    "im2col", "col2im", "_pdist_forward", "index_copy", "index_copy_",
    "reflection_pad1d_backward", "reflection_pad2d_backward", "replication_pad2d_backward",
    "_unsafe_masked_index", "alias_copy", "view_copy", "permute_copy", "expand_copy",
    "transpose_copy", "unsqueeze_copy", "squeeze_copy", "t_copy", "slice_copy", "select_copy",
    "split_with_sizes_copy", "unbind_copy", "_reshape_copy", "contiguous", "narrow_copy",
    # backward of views and indexing: write the gradient into a zero tensor of the input's shape
    "slice_backward", "select_backward", "diagonal_backward", "unfold_backward",
    # nested tensors built from (or padded out of) their components: copies
    "_nested_tensor_from_tensor_list", "_nested_tensor_from_mask", "to_padded_tensor", "_nested_from_padded",
    "_nested_from_padded_and_nested_example", "_nested_view_from_jagged_copy", "_nested_get_values_copy",
)


@register("embedding", "index", "_unsafe_index", "index_select", "gather", "take", "take_along_dim",
          "_embedding_bag", "_embedding_bag_forward_only")
def gather(c: OpCall) -> OpCost:
    src = c.args[0]  # the table (embedding) or the source tensor
    out = c.outs[0]
    idx = [t for t in tensors_in(c.args[1:]) if not t.is_floating_point()]
    read = sum(nbytes(t) for t in idx) + numel(out) * src.element_size()
    return OpCost(0, 0, bytes_read=read)


@register("embedding_dense_backward", "embedding_backward", "_embedding_bag_backward",
          "_embedding_bag_dense_backward")
def embedding_backward(c: OpCall) -> OpCost:
    return OpCost(0, numel(c.args[0]))


@register("index_select_backward")
def index_select_backward(c: OpCall) -> OpCost:
    return OpCost(0, numel(c.args[0]))


@register("scatter_add", "scatter_add_", "index_add", "index_add_", "scatter_reduce",
          "scatter_reduce_", "index_reduce", "index_reduce_")
def scatter_add(c: OpCall) -> OpCost:
    src = c.arg("src", c.arg("source"))
    return OpCost(0, numel(src) if isinstance(src, torch.Tensor) else numel(c.outs[0]))


@register("scatter", "scatter_", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put",
          "index_fill", "index_fill_", "masked_scatter_")
def scatter(c: OpCall) -> OpCost:
    acc = bool(c.arg("accumulate", False))
    vals = c.arg("values")
    return OpCost(0, numel(vals) if acc and isinstance(vals, torch.Tensor) else 0)


@register(
    "zeros", "ones", "full", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones",
    "new_full", "scalar_tensor", "arange", "linspace", "logspace", "eye", "tril_indices",
    "triu_indices", "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
    "bernoulli", "bernoulli_", "normal", "normal_", "uniform_", "exponential_", "random_",
    "multinomial", "fill_", "fill", "zero_", "_efficientzerotensor", "cauchy_", "geometric_",
    "log_normal_", "_fused_dropout",
)
def creation(c: OpCall) -> OpCost:
    written = sum(nbytes(o) for o in c.outs if isinstance(o, torch.Tensor))
    return OpCost(0, 0, bytes_read=0, bytes_written=written)


register_free(
    # views and reshapes
    "view", "_unsafe_view", "reshape", "_reshape_alias", "expand", "expand_as", "permute", "transpose",
    "transpose_", "t", "t_", "numpy_T", "mT", "mH", "adjoint", "squeeze", "squeeze_", "unsqueeze",
    "unsqueeze_", "select", "slice", "narrow", "split", "split_with_sizes", "unsafe_split",
    "unsafe_split_with_sizes", "unbind", "chunk", "unsafe_chunk", "tensor_split", "alias", "detach",
    "detach_", "as_strided", "as_strided_", "view_as", "view_as_real", "view_as_complex", "unfold",
    "diagonal", "movedim", "moveaxis", "flatten", "unflatten", "real", "imag", "conj", "_conj",
    "resolve_conj", "resolve_neg", "_neg_view", "_conj_physical", "swapaxes", "swapdims",
    "broadcast_to", "_nested_view_from_buffer", "lift_fresh", "lift", "_indices", "_values",
    "indices", "values",
    # metadata and allocation without initialisation
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_empty_affine_quantized",
    "empty_permuted", "resize_", "resize_as_", "set_", "sym_size", "sym_stride", "sym_numel",
    "sym_storage_offset", "is_same_size", "_local_scalar_dense", "item", "_assert_async",
    "_assert_tensor_metadata", "_functional_assert_async", "_assert_scalar", "record_stream",
    "is_nonzero", "_has_compatible_shallow_copy_type", "_version", "output_nr", "_shape_as_tensor",
    "sym_constrain_range", "sym_constrain_range_for_size", "_make_dep_token", "_nested_tensor_size",
    "_fw_primal", "_make_dual", "_unpack_dual", "is_coalesced", "dim", "size", "stride",
    "storage_offset", "sym_is_contiguous", "is_contiguous",
    # nested (jagged) tensors: views of the packed values and their metadata
    "_nested_get_values", "_nested_view_from_jagged", "_nested_get_offsets", "_nested_get_lengths",
    "_nested_get_ragged_idx", "_nested_get_jagged_dummy", "_nested_tensor_strides",
    "_nested_tensor_storage_offsets", "_nested_get_min_seqlen", "_nested_get_max_seqlen",
    "_nested_compute_contiguous_strides_offsets",
)
