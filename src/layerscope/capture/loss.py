"""The loss of a training step: which one a step runs, from the model and its inputs, and the loss itself.

A training loop does not sum its model's output: a language model trains on a cross-entropy over its
vocabulary, which transformers' causal-LM loss and torchtitan's train step both take on the logits
upcast to fp32. On a 128k vocabulary those fp32 logits, their log-softmax (saved for the backward)
and its gradient are the largest tensors of the step, so a step simulated with a sum under-predicts
what users run (Llama-3-8B, FSDP 8 x local batch 2 x 8,192: 49.5 GiB a rank with the sum, 68.8 GiB
with the model's own loss). The choices (``options.Loss``):

* ``model``: the model's own loss, its forward given ``labels`` = the token ids (transformers' LM
  heads shift them inside, as a user's loop passes ``labels=input_ids.clone()``). The labels are a copy
  of the ids: on meta inputs without values they have none either (a cross-entropy needs none), and
  where the ids have values the labels carry the same (capture/known.py); nothing is made up.
* ``cross-entropy``: the mean next-token cross-entropy of the logits in fp32, the labels the ids
  shifted by one (the last position has none): transformers' ``ForCausalLMLoss`` op for op.
* ``sum``: the sum of the output (its own ``.loss`` where the inputs gave it labels): what a step
  without a language-model loss runs.
* ``auto`` (the default): ``model`` where the forward takes ``labels``, the model has a language-model
  head (transformers' ``get_output_embeddings()``) and the inputs have token ids; else
  ``cross-entropy`` where the output turns out to be logits over the model's vocabulary for the token
  ids; else ``sum``.

A pipeline stage is no whole model and takes no labels: its last stage takes the ``cross-entropy`` per
micro-batch (torchtitan's pipelined loss), also where ``model`` was chosen. A ``loss_fn`` given is the
loss, whatever else. One ``StepLoss`` per call of an entry point: it records which loss the runs
applied (``used``), for the report's note.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError
from .inputs import iter_tensors
from .notes import Note

__all__ = ["StepLoss", "choose_loss", "default_loss", "next_token_loss", "given_note", "IGNORE_INDEX"]

IGNORE_INDEX = -100          # the label of a position without a next token (transformers' and torch's default)
_IDS_NAMES = ("decoder_input_ids", "input_ids")     # the ids the logits are over, in this order


def default_loss(output: Any) -> torch.Tensor:
    """The output's ``loss`` when it has one (transformers models given labels), else the sum of every
    floating-point output tensor that requires grad."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    outs = [t for t in iter_tensors(output) if t.requires_grad and (t.is_floating_point() or t.is_complex())]
    if not outs:
        raise InputError("a training step needs an output that requires grad (are all parameters "
                         "frozen, or does forward run under no_grad?)")
    total = outs[0].sum()
    for t in outs[1:]:
        total = total + t.sum()
    return total


def next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of ``logits`` [..., S, V] in fp32 against the next token of ``ids`` [..., S]
    (the last position has none): transformers' ``ForCausalLMLoss``, op for op (the upcast copy, the
    padded and shifted labels, the flattened views)."""
    logits = logits.float()
    labels = F.pad(ids, (0, 1), value=IGNORE_INDEX)[..., 1:].contiguous()
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=IGNORE_INDEX)


def _is_ids(t) -> bool:
    return isinstance(t, torch.Tensor) and t.dim() == 2 and not t.is_floating_point() and not t.is_complex() \
        and t.dtype is not torch.bool


def _ids_place(args: tuple, kwargs: dict):
    """Where the token ids the logits are over are: ``("kwargs", name)`` (a decoder's ids before the
    encoder's), or the one integer [B, S] tensor of the inputs; None where there is none or several."""
    for name in _IDS_NAMES:
        if _is_ids(kwargs.get(name)):
            return ("kwargs", name)
    found = [("args", i) for i, a in enumerate(args) if _is_ids(a)] + \
        [("kwargs", k) for k, v in kwargs.items() if _is_ids(v)]
    return found[0] if len(found) == 1 else None


def _vocabulary(model: nn.Module) -> frozenset:
    """The sizes the model's vocabulary may have: its config's ``vocab_size``, else the rows of its
    embedding tables (what tells logits from hidden states of another width)."""
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    if isinstance(size, int) and size > 1:
        return frozenset((size,))
    return frozenset(m.num_embeddings for m in model.modules() if isinstance(m, nn.Embedding))


def _lm_head(model: nn.Module) -> bool:
    get = getattr(model, "get_output_embeddings", None)
    try:
        return callable(get) and isinstance(get(), nn.Module)
    except Exception:   # noqa: BLE001 - a model that does not implement it has none to say
        return False


def _takes_labels(model: nn.Module) -> bool:
    try:
        return "labels" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def lm_logits(output: Any, ids: torch.Tensor, vocab: frozenset | None) -> torch.Tensor | None:
    """The output's language-model logits over ``ids``: its ``logits`` (a field or key), else the output
    itself or its first element, where that is a floating-point [*ids.shape, V] tensor (with ``vocab``,
    V one of its sizes); None otherwise."""
    if isinstance(output, dict):
        t = output.get("logits")
    else:
        t = getattr(output, "logits", None)
        if t is None and not hasattr(output, "keys"):      # a ModelOutput without logits has none
            t = output[0] if isinstance(output, (tuple, list)) and output else output
    if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != ids.dim() + 1 or \
            tuple(t.shape[:-1]) != tuple(ids.shape):
        return None
    return t if vocab is None or t.shape[-1] in vocab else None


class StepLoss:
    """The loss a step runs (see the module): ``kind`` "model", "cross-entropy" or "sum", as chosen before
    the run (``auto``'s cross-entropy falls back to the sum where the output has no logits: ``fallback``).
    ``inputs()`` gives the forward its labels (``model``); ``bind()`` makes the loss of one pass's (or one
    micro-batch's) inputs. ``used``: what the runs applied."""

    __slots__ = ("asked", "kind", "place", "labels", "fallback", "vocab", "used")

    def __init__(self, asked: str, kind: str, place=None, labels: bool = False, fallback: bool = False,
                 vocab: frozenset | None = None) -> None:
        self.asked, self.kind, self.place, self.labels = asked, kind, place, labels
        self.fallback, self.vocab = fallback, vocab
        self.used: set[str] = set()

    def _ids(self, args: tuple, kwargs: dict) -> torch.Tensor:
        where, key = self.place
        return args[key] if where == "args" else kwargs[key]

    def inputs(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """The forward's inputs, with ``labels`` = the token ids where the model's own loss is taken: a
        tensor of their own holding the ids' values (a data collator's ``input_ids.clone()``; torchtitan's
        labels are another tensor too), so that a real step holds it as a simulated one does."""
        if not self.labels:
            return args, kwargs
        with torch.no_grad():
            labels = self._ids(args, kwargs).clone()
        return args, {**kwargs, "labels": labels}

    def bind(self, args: tuple, kwargs: dict, *, stage: bool = False):
        """``loss(output)`` of a pass on ``args``/``kwargs`` (a pipeline's last ``stage``: of one
        micro-batch, on the logits, whatever the kind)."""
        if self.kind == "sum":
            return functools.partial(_summed, self)
        if self.kind == "model" and not stage:
            return functools.partial(_own, self)
        if self.place is None:
            raise InputError("a pipeline's last stage takes the next-token cross-entropy of the logits against the "
                             "token ids, and the inputs have none (input_ids, or one integer [batch, sequence] "
                             "tensor): give a loss_fn")
        return functools.partial(_cross_entropy, self, self._ids(args, kwargs), stage)

    def describe(self) -> Note:
        """The report's note: which loss the step ran (reports/notes.py words it)."""
        return Note("loss-chosen", {"used": tuple(sorted(self.used or {self.kind})), "kind": self.kind,
                                    "asked": self.asked, "labels": bool(self.labels),
                                    "fallback": bool(self.fallback), "ids": self.place is not None})


def _summed(choice: StepLoss, output):
    choice.used.add("sum")
    return default_loss(output)


def _own(choice: StepLoss, output):
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    if not isinstance(loss, torch.Tensor):
        raise InputError("the model was given labels for its own loss and returned none: use "
                         "loss='cross-entropy' or 'sum'")
    choice.used.add("model")
    return loss


def _cross_entropy(choice: StepLoss, ids: torch.Tensor, stage: bool, output):
    logits = lm_logits(output, ids, choice.vocab if choice.fallback else None)
    if logits is None:
        if choice.fallback:
            return _summed(choice, output)
        shapes = [tuple(t.shape) for t in iter_tensors(output)][:3]
        raise InputError(f"loss={choice.asked!r} takes a cross-entropy of language-model logits "
                         f"[{', '.join(map(str, ids.shape))}, vocabulary] over the token ids; the output has "
                         f"{shapes or 'no tensors'}: give loss='sum' or a loss_fn")
    choice.used.add("stage" if stage else "cross-entropy")
    return next_token_loss(logits, ids)


def given_note(fn) -> Note:
    """The report's note for a step whose loss is a given ``loss_fn``: the first line of its docstring says
    what it is, where it has one."""
    doc = (getattr(getattr(fn, "func", fn), "__doc__", None) or "").strip().splitlines()
    return Note("loss-given", {"doc": doc[0].rstrip('.') if doc else None})


def choose_loss(model: nn.Module, args: tuple, kwargs: dict, loss: str = "auto") -> StepLoss:
    """The StepLoss ``loss`` (an ``options.Loss`` choice, checked there) asks of ``model`` on these inputs
    (see the module). A choice the model or its inputs cannot take is one clear InputError."""
    place = _ids_place(args, kwargs)
    given = kwargs.get("labels") is not None
    own = _takes_labels(model) and (given or place is not None and _lm_head(model))
    if loss == "sum" or loss == "auto" and not own and place is None:
        return StepLoss(loss, "sum", place)
    if loss == "model" or loss == "auto" and own:
        if not _takes_labels(model):
            raise InputError(f"loss='model' gives the forward labels, and {type(model).__name__}.forward takes "
                             "none: use loss='cross-entropy' (a language model's logits) or 'sum'")
        if place is None and not given:
            raise InputError("loss='model' gives the forward labels from the token ids, and the inputs have none "
                             "(input_ids, or one integer [batch, sequence] tensor)")
        return StepLoss(loss, "model", place, labels=not given)
    if place is None:
        raise InputError("loss='cross-entropy' is taken against the token ids, and the inputs have none "
                         "(input_ids, or one integer [batch, sequence] tensor)")
    auto = loss == "auto"
    return StepLoss(loss, "cross-entropy", place, fallback=auto, vocab=_vocabulary(model) if auto else None)
