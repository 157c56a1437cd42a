"""Which of the search's dimensions this build can apply: the capability check that gates context and
expert parallel candidates (planning/search/space.py).

``ParallelConfig`` accepts ``cp`` and ``ep`` before ``parallelize`` (planning/apply.py) applies them: until
each lands, ``parallelize`` refuses a configuration that uses it with one line ("... is not applied yet").
The search asks ``parallelize`` itself, once per dimension, instead of keeping a list of its own: a probe
configuration with that one degree at 2 (over 2 ranks, FSDP over both) is handed to ``parallelize`` with
an empty module and a stand-in mesh; its refusal is the dimension's, and every candidate that uses the
dimension is listed as "refused" with that line (never simulated, never dropped). When the dimension is
applied the refusal is gone and its candidates are simulated as any other, with nothing to change here:
whatever else ``parallelize`` makes of the empty probe (it has no blocks to shard) is not a refusal."""

from __future__ import annotations

from typing import Iterable

from torch import nn

from ...errors import InputError
from ...options import iec
from ..apply import parallelize
from ..config import ParallelConfig
from ..context_parallel import check_context_parallel
from .candidates import Candidate
from .sparse import SparseModel, alltoall_bytes, ring_bytes, sparse_state_bytes

__all__ = ["GATED", "refusals", "refused_candidate", "simulation_refuses", "uses"]

# the dimensions parallelize may refuse while they are being built (ParallelConfig field names)
GATED = ("cp", "ep")
_REFUSAL = "not applied yet"        # parallelize's refusal line (planning/apply.py)
EXACT = "what is exact"             # where a refused candidate's why turns from the refusal to its figures


class _ProbeMesh:
    """Stands in for the device mesh: parallelize only checks that one is given before its refusals."""

    mesh_dim_names = ()


def _refusal(dim: str) -> str | None:
    """parallelize's refusal of ``dim`` at degree 2, or None where it applies it."""
    probe = ParallelConfig(gpus=2, fsdp=2 if dim == "ep" else 1, **{dim: 2})
    try:
        parallelize(nn.Module(), probe, _ProbeMesh())
    except InputError as e:
        line = str(e).splitlines()[0]
        return line if _REFUSAL in line else None
    except Exception:       # noqa: BLE001 - past the refusal, an empty module on a stand-in mesh may fail anyhow
        return None
    return None


def refusals(configs: Iterable[ParallelConfig]) -> dict[str, str]:
    """For each gated dimension some of ``configs`` use (degree > 1) and parallelize refuses: its line."""
    used = {d for c in configs for d in GATED if getattr(c, d) > 1}
    out = {}
    for d in sorted(used):
        why = _refusal(d)
        if why is not None:
            out[d] = why
    return out


def simulation_refuses(model: nn.Module, args: tuple, kwargs: dict, c: ParallelConfig) -> str | None:
    """The line the simulation's own check refuses candidate ``c`` with on these inputs, before it runs
    anything (context parallel: ``check_context_parallel``, for CUDA ranks, the search's target: a pipeline
    beside it, attention other than SDPA, a mask, a sequence not in ``2 x cp`` chunks), or None."""
    if c.cp == 1:
        return None
    try:
        check_context_parallel(model, args, kwargs, c, "cuda")
    except InputError as e:
        return str(e).splitlines()[0]
    return None


def uses(c: ParallelConfig, refused: dict[str, str]) -> str | None:
    """The first refused dimension ``c`` uses, or None."""
    return next((d for d in GATED if d in refused and getattr(c, d) > 1), None)


def refused_candidate(c: ParallelConfig, why: str, facts: SparseModel, split: list[tuple[int, int]], seq: int | None,
                      limit: int) -> Candidate:
    """``c`` listed as refused with parallelize's line and what is exact about it (planning/search/sparse.py):
    the state a rank holds at least (over the limit or not), its all-to-all and ring bytes a step."""
    for d in GATED:         # the probe's degree (2) in parallelize's line: this candidate's own
        why = why.replace(f"({d} 2)", f"({d} {getattr(c, d)})")
    state = sparse_state_bytes(c, split)
    parts = [f"a rank holds at least {iec(state)} of parameter shards"
             + (f", over the limit by at least {iec(state - limit)}" if state > limit else "")]
    if c.ep > 1 and seq:
        a2a = alltoall_bytes(c, facts, seq)
        if a2a is not None:
            skew = "" if c.routing == "even" else \
                f"; under {c.routing} the hottest expert's rank receives up to {c.routing_skew:g}x its share"
            parts.append(f"its all-to-alls send {iec(a2a)} a rank a step (even routing{skew})")
    if c.cp > 1 and seq:
        ring = ring_bytes(c, facts, seq)
        if ring is not None:
            parts.append(f"its ring sends at least {iec(ring)} of K/V a rank a step")
    return Candidate(c, "refused", f"{why}; {EXACT}: {'; '.join(parts)}",
                     over_bytes=state - limit if state > limit else None)
