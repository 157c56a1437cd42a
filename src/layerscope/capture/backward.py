"""Backward attribution, one mechanism for every user: an autograd node belongs to the module call
that was innermost when the forward created it.

Autograd numbers nodes in the order a thread's forward creates them (``_get_sequence_nr`` gives the
next number). A user notes, at moments of its forward, the next number and the call innermost until
then (``SeqOwners.note``): the op recorder at every op (capture/session.py), the tracker at every
call's entry and exit (capture/tracker.py). A node's number then falls between two notes and the
later one names its call. A gradient accumulation (AccumulateGrad, numbered past every node) belongs
to the call of the module that owns the parameter.

How a user learns that a node runs differs only in what it needs: the op recorder asks
``current_autograd_node()`` inside its dispatch mode (every op, no hooks); the tracker's backward
callbacks (latency timing, the pipeline's unit marks) put a cheap pre-hook on every node of the graph
a root call built (``hook_graph``; torch's full backward hooks would wrap every module's inputs and
outputs in extra autograd nodes, which tripled the backward of a small GPT-2).
"""

from __future__ import annotations

from bisect import bisect_right
from functools import partial
from typing import Any, Callable

from .inputs import iter_tensors

__all__ = ["ACCUMULATE_GRAD_SEQ", "SeqOwners", "hook_graph"]

# the sequence number autograd gives every AccumulateGrad node (UINT64_MAX): never a forward op's
ACCUMULATE_GRAD_SEQ = 2 ** 64 - 1


class SeqOwners:
    """Notes (next sequence number, the call innermost until then), in the order they were taken;
    ``params`` maps a parameter (by id) to the call its gradient accumulation belongs to. The two
    lists are public: a hot path appends to them directly (one method call less per op)."""

    __slots__ = ("seqs", "owners", "cache", "params")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.owners: list[Any] = []
        self.cache: dict[int, Any] = {}
        self.params: dict[int, Any] = {}

    def note(self, seq: int, owner: Any) -> None:
        self.seqs.append(seq)
        self.owners.append(owner)

    def owner(self, seq: int, default: Any = None) -> Any:
        """The call that made the node numbered ``seq`` (``default``: made after the last note)."""
        found = self.cache.get(seq)
        if found is None:
            i = bisect_right(self.seqs, seq)
            found = self.owners[i] if i < len(self.owners) else default
            self.cache[seq] = found
        return found

    def of_node(self, node, default: Any = None) -> Any:
        """The call an autograd node belongs to: by its number, or by its parameter."""
        seq = node._sequence_nr()
        if seq == ACCUMULATE_GRAD_SEQ:
            return self.params.get(id(getattr(node, "variable", None)), default)
        return self.owner(seq, default)

    def spans(self, seq: int) -> bool:
        """Whether ``seq`` lies between the first and the last note (a node made during them)."""
        return bool(self.seqs) and self.seqs[0] <= seq < self.seqs[-1]


def hook_graph(output: Any, owners: SeqOwners, leaf_owner: Callable[[Any], Any], hooked_leaves: dict[int, Any],
               on_node: Callable[[Any, Any], None]) -> list:
    """A pre-hook ``on_node(call, grad_outputs)`` on every node of the graph that ``output``'s
    tensors end, made between the notes of ``owners`` (nodes made before: the inputs' own history,
    not walked); a gradient accumulation reached is hooked once per ``hooked_leaves`` (shared by the
    graphs of one step) and belongs to ``leaf_owner(parameter)``. Returns the hooks' handles."""
    handles = []
    todo = [t.grad_fn for t in iter_tensors(output) if t.grad_fn is not None]
    seen: dict[int, Any] = {}     # the nodes themselves: a dropped wrapper's id could come back
    while todo:
        node = todo.pop()
        if id(node) in seen:
            continue
        seen[id(node)] = node
        s = node._sequence_nr()
        if owners.spans(s):
            call = owners.owner(s)
        elif hasattr(node, "variable"):        # AccumulateGrad: a parameter's (or input's) .grad
            if id(node) in hooked_leaves:
                continue
            hooked_leaves[id(node)] = node
            call = leaf_owner(node.variable)
        else:                                  # made before this call: its inputs' history
            continue
        handles.append(node.register_prehook(partial(on_node, call)))
        todo.extend(f for f, _ in node.next_functions if f is not None)
    return handles
