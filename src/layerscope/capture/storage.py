"""Storage lifetimes: every storage created or freed during a run, de-duplicated by storage.

The op recorder hands each op's outputs (and inputs) to ``StorageTracker.on_op``. A storage seen for
the first time becomes a Block, allocated at the current op; a weak reference on the storage's Python
object (PyTorch keeps one Python object per live storage) marks the Block freed at the op that was
running when the last tensor using it died. Views share their base's storage, so they cost nothing.
This works the same on real, meta and fake tensors: only ``nbytes`` is read, never data.

A Block's category is decided after the run from the roles it played, highest first:
parameter, buffer, gradient, optimizer_state, input, output, activation (saved for backward),
workspace (a library's own persistent scratch, ``StorageTracker.workspace``), temporary. So a
gradient is a gradient from the op that computed it, although AccumulateGrad only adopts it as
``.grad`` later.
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch

__all__ = ["CATEGORIES", "Block", "StorageTracker", "PARAM", "BUFFER", "GRAD", "OPT", "INPUT", "OUTPUT",
           "SAVED", "WORKSPACE", "cuda_block_size"]

CATEGORIES = ("parameter", "buffer", "gradient", "optimizer_state", "input", "output", "activation",
              "workspace", "temporary")
# role bits, in category order
PARAM, BUFFER, GRAD, OPT, INPUT, OUTPUT, SAVED, WORKSPACE = (1 << i for i in range(8))
_TEMPORARY = len(CATEGORIES) - 1


def cuda_block_size(nbytes: int) -> int:
    """Bytes the CUDA caching allocator hands out for a request: 512-byte blocks, nothing for 0 bytes
    (c10/cuda/CUDACachingAllocator.cpp: kMinBlockSize = 512, round_size)."""
    if nbytes <= 0:
        return 0
    return (nbytes + 511) // 512 * 512


class Block:
    """One storage: its size, when it was allocated and freed (global op indices), and its roles."""

    __slots__ = ("nbytes", "alloc", "free", "pass_index", "layer", "phase", "roles", "saved_by", "op", "tag",
                 "born", "__weakref__")

    def __init__(self, nbytes: int, alloc: int, pass_index: int, layer: int, phase: str, op: str = "",
                 born: int | None = None) -> None:
        self.nbytes = nbytes
        self.alloc = alloc          # -1: existed before the run
        self.born = alloc if born is None else born   # the op running when the Block was made
        self.free: int | None = None  # last op during which it was alive; None: alive at the end
        self.pass_index = pass_index  # which forward/backward pass created it (-1: before the run)
        self.layer = layer          # layer index (in that pass's trace) of the op that created it
        self.phase = phase
        self.roles = 0
        self.saved_by: tuple[int, int] | None = None  # (pass, layer) that saved it for backward
        self.op = op                # the op that allocated it ("" before the run, or resized outside one)
        self.tag: str | None = None  # a finer role a caller gives it (parallel/: gathered parameters, ...)

    @property
    def category(self) -> int:
        roles = self.roles
        if not roles:
            return _TEMPORARY
        return (roles & -roles).bit_length() - 1  # lowest set bit = highest-priority role


class StorageTracker:
    """Live storages of a run and the op clock they are timed against."""

    def __init__(self, block_size=None, workspace: Callable[[str], int | None] | None = None,
                 kernels=None) -> None:
        self.block_size = block_size or (lambda n: n)
        # a CUDA target's kernels (costs/cuda_scratch.CudaKernels): the scratch they allocate inside
        # themselves, which no tensor shows, and the tensors they keep at other sizes than the simulation's
        # CPU kernels; and a tensor the optimizer makes from a Python number without a device (torch's
        # Adam's ``step``, torch.tensor(0.0) unless fused or capturable) is host memory there, not the
        # device's. None: the target is the CPU
        self.kernels = kernels
        self._elsewhere: dict[int, weakref.ref] = {}
        # op name -> bytes of the persistent workspace the op's library takes on its thread's first
        # call (None: the op takes none); see ``workspace``
        self.workspace_of = workspace
        self.workspaces: dict[tuple[str, str], Block] = {}
        self.blocks: list[Block] = []
        self.live: dict[int, Block] = {}
        self._refs: dict[int, weakref.ref] = {}
        self.clock = -1             # index of the op running now (global across passes)
        self.pass_index = -1
        self.layer = 0
        self.phase = "setup"
        self.untracked = 0          # tensors without a plain storage (sparse, nested, ...)
        self.op_name = ""           # the op running now (set by the session before on_op)
        self.recomputing = False    # the op runs in a checkpointed block's recompute (in the backward)
        # id(Block) -> Blocks without a storage of their own that die with it (capture/compose.py: the
        # copies of a block's storage that outlive the pass)
        self.followers: dict[int, list[Block]] = {}
        # called after each op with (op name, its input tensors, its output tensors): capture/compose.py
        # watches the optimizer's step so
        self.observer: Callable[[str, list, list], None] | None = None

    # ---- storages --------------------------------------------------------------------------------
    def _storage(self, t: torch.Tensor):
        if hasattr(type(t), "__tensor_flatten__"):
            # a wrapper subclass (DTensor) has no storage of its own: its one inner tensor's is the memory
            inner = [x for x in (getattr(t, n) for n in t.__tensor_flatten__()[0]) if isinstance(x, torch.Tensor)]
            if len(inner) == 1:
                return self._storage(inner[0])
        try:
            return t.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            self.untracked += 1
            return None

    def block_of(self, t: torch.Tensor, nbytes: int | None = None) -> Block | None:
        """The Block of ``t``'s storage, registered (allocated now) the first time it is seen."""
        st = self._storage(t)
        if st is None:
            return None
        key = id(st)
        b = self.live.get(key)
        if b is None:
            if key in self._elsewhere:
                return None
            size = int(st.nbytes()) if nbytes is None else nbytes
            b = Block(self.block_size(size), self.clock, self.pass_index, self.layer, self.phase, self.op_name)
            if self.recomputing:
                b.tag = "recompute"
            self.live[key] = b
            self.blocks.append(b)
            self._refs[key] = weakref.ref(st, self._freed_cb(key, b))
        return b

    def adopt(self, t: torch.Tensor, block: Block) -> None:
        """``t``'s storage, never seen, is ``block`` (made by the caller, which set its fields): it dies
        with the storage (capture/compose.py: the gradient of a block the simulation did not run)."""
        st = self._storage(t)
        if st is None:
            return
        key = id(st)
        self.live[key] = block
        self._refs[key] = weakref.ref(st, self._freed_cb(key, block))

    def _freed_cb(self, key: int, block: Block):
        def freed(_ref) -> None:
            if self.live.get(key) is block:
                block.free = self.clock
                del self.live[key]
                del self._refs[key]
                if self.followers:
                    for f in self.followers.pop(id(block), ()):
                        f.free = self.clock
        return freed

    def resized(self, t: torch.Tensor) -> Block | None:
        """``t``'s storage was resized in place (``UntypedStorage.resize_``, which no dispatch mode sees:
        FSDP2 frees and re-allocates its gathered parameters so): the old Block ends at the op running
        now, and a storage that holds bytes again is a new Block from the next op on."""
        st = self._storage(t)
        if st is None:
            return None
        key = id(st)
        size = int(st.nbytes())
        b = self.live.get(key)
        if b is not None and b.nbytes == self.block_size(size):
            return b
        if b is not None:
            b.free = self.clock
            del self.live[key]
            del self._refs[key]
        if size == 0:
            return None
        nb = Block(self.block_size(size), self.clock + 1, self.pass_index, self.layer, self.phase, "resize_",
                   self.clock)
        self.live[key] = nb
        self.blocks.append(nb)
        self._refs[key] = weakref.ref(st, self._freed_cb(key, nb))
        return nb

    def moved(self, t: torch.Tensor, tag: str) -> Block | None:
        """``t``'s storage is copied to other memory now and the original let go of, a move the
        simulation's one device does not make itself (FSDP2's CPU offload copies each reduced gradient
        to the host): its Block ends at the op running now, and a new one, ``tag``ged and with the same
        roles, holds the same bytes from the next op until the storage dies."""
        st = self._storage(t)
        if st is None:
            return None
        key = id(st)
        b = self.live.get(key)
        if b is None:             # never seen on the device: it is the other memory's from the start
            b = self.block_of(t)
            if b is not None:
                b.tag = tag
            return b
        b.free = self.clock
        nb = Block(b.nbytes, self.clock + 1, self.pass_index, self.layer, self.phase, "copy to host", self.clock)
        nb.roles, nb.tag = b.roles, tag
        self.live[key] = nb
        self.blocks.append(nb)
        self._refs[key] = weakref.ref(st, self._freed_cb(key, nb))
        return nb

    def resize_block(self, t: torch.Tensor, nbytes: int) -> None:
        """``t``'s storage holds ``nbytes`` on the target, whatever the simulation's kernel made it."""
        b = self.block_of(t)
        if b is not None:
            b.nbytes = self.block_size(nbytes)

    def elsewhere(self, t: torch.Tensor) -> None:
        """``t``'s storage is not in this device's memory (a CUDA target's host tensor): never a Block."""
        st = self._storage(t)
        if st is None or id(st) in self.live:
            return
        key = id(st)

        def gone(_ref, key=key) -> None:
            self._elsewhere.pop(key, None)
        self._elsewhere[key] = weakref.ref(st, gone)

    def mark(self, t: torch.Tensor, role: int) -> Block | None:
        b = self.block_of(t)
        if b is not None:
            b.roles |= role
        return b

    def transient(self, nbytes: int, tag=None) -> None:
        """Scratch a kernel allocates and frees inside itself (no tensor of it is ever seen): a
        temporary block alive during the next op only, the one running now (``tag``: what it is,
        for the caller's categories)."""
        b = Block(self.block_size(nbytes), self.clock + 1, self.pass_index, self.layer, self.phase, "", self.clock)
        b.free = self.clock + 1
        b.tag = tag
        self.blocks.append(b)

    def hold(self, nbytes: int, tag=None) -> Block:
        """Bytes held from the op running now until ``release`` by something no tensor of the run shows
        (checkpoint's copy of the CPU generator's state, made outside the dispatcher)."""
        b = Block(self.block_size(nbytes), self.clock, self.pass_index, self.layer, self.phase)
        b.tag = tag
        self.blocks.append(b)
        return b

    def release(self, b: Block) -> None:
        """``b`` (from ``hold``) is let go of at the op running now."""
        if b.free is None:
            b.free = self.clock

    def workspace(self, kind: str, thread: str, nbytes: int) -> Block:
        """A library's persistent workspace (cuBLAS's: one per thread and stream, taken at the thread's
        first call and kept for the process's life, costs/cublas.py), held once ``kind`` is used on
        ``thread``. It is counted from the start of the run, as every step after a job's first holds it
        from its start: a process-wide constant, not the working memory of the layer whose op made it
        (a pipeline unit's, a layer's backward peak); never freed."""
        key = (kind, thread)
        b = self.workspaces.get(key)
        if b is None:
            b = Block(self.block_size(nbytes), -1, -1, 0, "setup", kind, self.clock)
            b.roles = WORKSPACE
            self.workspaces[key] = b
            self.blocks.append(b)
        return b

    def close(self) -> None:
        """Stop watching: storages that die after the run no longer change its blocks."""
        self._refs.clear()
        self.live.clear()

    # ---- events ----------------------------------------------------------------------------------
    def on_op(self, ins, outs, sizes: dict[int, int] | None = None) -> None:
        """An op ran: its outputs (and any input never seen before) are live from this op on.
        ``sizes`` corrects the bytes of some outputs (by index) where a fake kernel differs."""
        self.clock += 1
        for i, t in enumerate(outs):
            self.block_of(t, nbytes=sizes.get(i) if sizes else None)
        for t in ins:
            self.block_of(t)
        if self.observer is not None:
            self.observer(self.op_name, ins, outs)

    @staticmethod
    def _saved(b: Block, by: tuple[int, int]) -> None:
        b.roles |= SAVED
        if b.saved_by is None:
            b.saved_by = by

    def mark_saved(self, t: torch.Tensor, layer: int) -> None:
        b = self.block_of(t)
        if b is not None:
            self._saved(b, (self.pass_index, layer))

    def backward_starts(self) -> None:
        """Storages made by this pass's forward that are still alive when its backward begins are held
        for backward (by autograd, or by a checkpoint or a hook of the model's own)."""
        p = self.pass_index
        for b in self.live.values():
            if b.pass_index == p and b.phase == "forward":
                self._saved(b, (p, b.layer))
