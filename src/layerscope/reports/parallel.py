"""ParallelReport: a sharded-training configuration's per-rank memory (``layerscope.parallel``); its columns,
header and footer. A row per role (ranks that hold the same bytes share one row); every global rank is in
the JSON's ``plans[i].ranks``."""

from __future__ import annotations

import re

from dataclasses import dataclass
from typing import Any, TextIO

from ..options import iec
from ..planning.simulate.results import ESTIMATES, ParallelPlan, RankMemory
from ..planning.simulate.sharded_rank import PARTS
from .base import ReportRecord
from .notes import NotesField
from .table import Column, Fact, Table, flat_table

__all__ = ["ParallelReport", "RoleRow", "PARALLEL_COLUMNS", "SCHEMA", "STEP_PARTS"]

SCHEMA = 6      # the parallel JSON's own version (plans, ranks, measured). 2: a rank's breakdown has the
#                 estimate "gloo late free (estimate)"; 3: a rank's host_bytes, a plan's offload (CPU
#                 offload), schedule and stages; 4: a plan's step_time, tokens_per_s and mfu filled on
#                 CUDA ranks, and its timing (their parts); 5: timing's host_wait; 6: a rank's stages, the
#                 search's passes, search_limit, proven and unsearched_step_time_at_least; nothing removed
#                 or renamed

_SHORT = {"sharded parameters": "Params", "gathered parameters": "Gathered", "gradients": "Grads",
          "optimizer state": "Optim", "activations": "Activ", "recompute": "Recomp",
          "communication buffers": "Comm", "inputs, outputs and buffers": "In/out", "workspaces": "Wkspace",
          "temporary": "Temp",
          ESTIMATES[0]: "NCCL~", ESTIMATES[1]: "Gloo~"}


@dataclass(frozen=True, slots=True)
class RoleRow:
    """The ranks that hold the same bytes (one simulated rank stands for them)."""

    index: int
    ranks: tuple[int, ...]
    memory: RankMemory

    @property
    def label(self) -> str:
        r = self.ranks
        if len(r) == 1:
            return str(r[0])
        contiguous = r == tuple(range(r[0], r[-1] + 1))
        return f"{r[0]}-{r[-1]}" if contiguous else f"{r[0]},{r[1]},..,{r[-1]} ({len(r)})"


def _part(name: str, drop: int) -> Column:
    return Column(name.replace(" ", "_").replace(",", "").replace("(", "").replace(")", "").replace("/", "_"),
                  _SHORT[name], "bytes", lambda r, rep, n=name: r.memory.breakdown.get(n, 0), drop=drop,
                  description=name)


PARALLEL_COLUMNS: tuple[Column, ...] = (
    Column("peak_bytes", "Peak", "bytes", lambda r, rep: r.memory.peak_bytes),
    Column("phase", "At", "text", lambda r, rep: f"step {r.memory.peak_step} {r.memory.peak_phase}", drop=5),
    # a narrow terminal keeps the peak, the shards, the gathered parameters, optimizer state and
    # activations longest
    *(_part(p, d) for p, d in zip(PARTS + ESTIMATES, (0, 0, 1, 0, 0, 2, 4, 4, 4, 3, 2, 2))),
)


def _gib(n: int) -> str:
    return iec(n)


# the predicted step's parts (``timing``'s keys) in the order they add up, with their names; the
# terminal's step line and the HTML page's step bar both read it
STEP_PARTS = (("compute", "compute"), ("host_wait", "GPU waiting for the host"), ("tp_comm", "TP communication"),
              ("cp_comm", "CP ring communication"), ("exposed_comm", "exposed data-parallel/pipeline communication"))


def _step_line(p: ParallelPlan) -> str:
    t = p.timing or {}
    parts = [f"{name} {t.get(k, 0) * 1e3:,.1f} ms" for k, name in STEP_PARTS if k == "compute" or t.get(k)]
    if t.get("bubble"):
        parts.append(f"bubble {t['bubble']:.0%}")
    rate = (f", {p.tokens_per_s:,.0f} tokens/s per GPU" if p.tokens_per_s else "") + \
        (f", MFU {p.mfu:.1%}" if p.mfu is not None else "")
    return f"{p.step_time * 1e3:,.1f} ms on the {t.get('gpu', 'GPU')}{rate} ({'; '.join(parts)})"


_SHOWN_FITTING, _SHOWN_MISSES = 10, 5


def _search_facts(search: dict | None) -> list[Fact]:
    """The search's ranked plans (fitting by step time, then the nearest misses) and why each family lost."""
    if not search:
        return []
    out = []
    rows = search["candidates"]
    fitting = [r for r in rows if r["status"] == "fits"]
    for i, r in enumerate(fitting[:_SHOWN_FITTING], 1):
        out.append(Fact(f"Plan {i}", f"{r['label']}: {r['step_time'] * 1e3:,.1f} ms"
                        + (f", MFU {r['mfu']:.1%}" if r["mfu"] is not None else "")
                        + f", peak {_gib(r['peak_bytes'])}"))
    if len(fitting) > _SHOWN_FITTING:
        out.append(Fact("Plans", f"{len(fitting) - _SHOWN_FITTING} more fit (the JSON lists them)"))
    misses = [r for r in rows if r["status"] in ("oom", "oom-bound", "dominated")]
    for r in misses[:_SHOWN_MISSES]:
        over = r["over_bytes"]
        amount = ("at least " if r["status"] != "oom" else "") + _gib(over) if over is not None else "?"
        out.append(Fact("Out of memory", f"{r['label']}: over by {amount}"
                        + (f" ({r['why']})" if r["status"] != "oom" else ""), alert=True))
    refused = [r for r in rows if r["status"] == "refused"]
    # one line a refusal (parallelize's of a dimension, the simulation's of a combination; the degrees left out:
    # they vary), the rows in the JSON
    lines = [re.sub(r" \((cp|ep|pp) \d+\)", "", r["why"].partition("; what is exact")[0]) for r in refused]
    for why in dict.fromkeys(lines):
        mine = [r for r, line in zip(refused, lines) if line == why]
        out.append(Fact("Refused", f"{len(mine):,} configurations ({len({r['family'] for r in mine}):,} families): "
                        f"{why}; each listed in the JSON with what is exact about it"))
    later = [f["family"] for f in search["families"] if f["why"].startswith("not searched")]
    for f in search["families"]:
        if not f["why"].startswith("not searched"):
            out.append(Fact("Family", f"{f['family']}: {f['why']}"))
    if later:
        pipes = sum(not k.endswith(", pp 1") for k in later)
        what = f"{len(later)} famil{'y' if len(later) == 1 else 'ies'} ({pipes} with a pipeline)"
        out.append(Fact("Not searched", f"{what}: the search's limit was spent (--search-limit, or hold a "
                        "degree fixed: --pp, --tp)"))
    return out


def _search_headline(search: dict | None) -> Fact | None:
    """The search's answer in one line, first: the best of how many simulated, and whether it is proven
    best among every configuration (each other one simulated or ruled out by a bound), or, where the
    limit left some unsearched, how far below it their step's lower bounds go."""
    if not search or "proven" not in search:     # a report saved before the search said so
        return None
    rows = search["candidates"]
    # a configuration refused (a dimension or combination this build does not simulate: its own line) is not one
    # searched
    n, total = search["simulated"], sum(r["status"] != "refused" for r in rows)
    best = next((r for r in rows if r["status"] == "fits"), None)
    left = [r for r in rows if r["status"] == "unsearched"]
    if best is None:
        head = f"no configuration simulated fits (the nearest miss of {n} simulated is shown)"
    elif search["proven"]:
        return Fact("Search", f"best of {n} simulated; proven best among all {total:,} configurations (each "
                    "other one simulated, or out of memory or no faster by a lower bound or a dominance)")
    else:
        head = f"best of {n} simulated"
    if not left:
        return Fact("Search", head, alert=True)
    least = search.get("unsearched_step_time_at_least")
    without = sum(r["step_time_at_least"] is None for r in left)
    fams = len({r["family"] for r in left})
    what = (f"; NOT PROVEN: {len(left):,} configurations ({fams} famil{'y' if fams == 1 else 'ies'}) not simulated "
            f"within the search's limit (--search-limit)")
    if least is not None:
        what += f", their step's lower bounds go down to {least * 1e3:,.1f} ms"
        if best is not None:
            what += f" (this plan: {best['step_time'] * 1e3:,.1f} ms)"
    if without:
        what += f"; {without:,} without a lower bound"
    return Fact("Search", head + what, alert=True)


class ParallelReport(NotesField, ReportRecord):
    """Per-rank memory of sharded-training configurations. ``plans``: one here (the search fills more);
    ``options``: what the simulation was run with; ``notes``: what it assumed or could not show."""

    kind = "parallel"
    json_rows = "roles"
    _html_part = "parallel"

    def __init__(self, *, model_name: str, options: dict, plans: tuple[ParallelPlan, ...], notes=(),
                 search: dict | None = None) -> None:
        self.model_name = model_name
        self.options = dict(options)
        self.plans = tuple(plans)
        self.notes = tuple(notes)
        self.search = search          # the search's candidates and families (api/_search.py search_dict)
        self.schema = SCHEMA

    @property
    def plan(self) -> ParallelPlan:
        return self.plans[0]

    @property
    def roles(self) -> tuple[RoleRow, ...]:
        groups: dict[Any, list[RankMemory]] = {}
        for r in self.plan.ranks:
            key = (r.simulated_as, r.peak_bytes)
            groups.setdefault(key, []).append(r)
        return tuple(RoleRow(i, tuple(m.rank for m in ms), ms[0]) for i, ms in enumerate(groups.values()))

    def _context(self) -> tuple[Fact, ...]:
        o, p = self.options, self.plan
        batch = f"local batch {p.local_batch}" if p.local_batch is not None else "inputs as given"
        headline = _search_headline(self.search)
        return ((headline,) if headline is not None else ()) + (Fact("Model", self.model_name),
                Fact("Configuration", f"{p.gpus} {'rank' if o.get('device') == 'cpu' else 'GPU'}"
                                      f"{'s' if p.gpus != 1 else ''}: {p.label}"
                                      # expert parallel and the routing its figures assume (the plan's record
                                      # keeps its JSON fields: the options echo both)
                                      + (f", ep {o['ep']} (routing {o.get('routing')})" if o.get("ep", 1) > 1
                                         else "")),
                Fact("Batches", f"{batch}, {p.microbatches} micro-batch(es), accumulation {p.accumulation}"
                     + (f", global batch {p.global_batch}" if p.global_batch else "")),
                Fact("Precision", f"mixed precision {p.mixed_precision} (reduce {p.reduce_dtype}), "
                                  f"model {p.model_dtype}"),
                Fact("Optimizer", str(o.get("optimizer"))),
                Fact("Device", str(o.get("device")) + (f" ({o['gpu']})" if o.get("gpu") else "")))

    def _footer(self) -> tuple[Fact, ...]:
        p = self.plan
        big = p.largest
        out = [Fact("Largest rank", f"{big.rank}: {_gib(big.peak_bytes)} at step {big.peak_step} {big.peak_phase}"
                    + (f" in {big.peak_layer or '(root)'}" if big.peak_layer is not None else "")
                    + f" ({_gib(big.peak_bytes - big.simulated_peak_bytes)} of it estimated)")]
        if big.host_bytes:
            out.append(Fact("Host (CPU offload)", f"{_gib(max(r.host_bytes for r in p.ranks))} per rank at most, "
                                                  "outside the device's peak"))
        if p.limit_bytes is not None:
            out.append(Fact("Limit", f"{_gib(p.limit_bytes)}: " + ("fits" if p.fits else
                            f"DOES NOT FIT by {_gib(p.over_bytes)}"), alert=not p.fits))
        for c in big.collectives:
            if c.kind in ("send", "recv"):       # a pipeline's point-to-point transfers
                out.append(Fact(f"{c.kind} ({c.group})", f"{c.calls} per step, "
                                f"{c.bytes_read if c.kind == 'send' else c.bytes_written:,} B"))
                continue
            what = "tied weights' gradients, " if c.op == "tie.all_reduce" else ""
            out.append(Fact(f"{c.kind} ({what}{c.group}, {c.group_size})",
                            f"{c.calls} per step, {c.bytes_written if c.kind == 'all-gather' else c.bytes_read:,} B "
                            f"of tensors, {c.ring_bytes:,} B through each rank by a ring"))
        if p.step_time is not None:
            out.append(Fact("Step time (predicted)", _step_line(p)))
        if p.measured is not None:
            m = p.measured
            for role in self.roles:
                got = [m["ranks"][r]["peak_bytes"] for r in role.ranks if r < len(m["ranks"])]
                if got:
                    lo, hi = min(got), max(got)
                    pred = role.memory.peak_bytes
                    out.append(Fact(f"Measured, rank{'s' if len(role.ranks) > 1 else ''} {role.label}",
                                    f"{_gib(lo)}" + (f"-{_gib(hi)}" if hi != lo else "")
                                    + f" (predicted {_gib(pred)}: {pred / hi - 1:+.1%} of the largest)"))
            out.append(Fact("Run", f"losses {'equal' if m['loss_equal'] else 'DIFFER from'} one process "
                                   f"(largest relative difference {m['max_rel_loss_diff']:.1e}); step "
                                   f"{m['step_time'] * 1e3:,.1f} ms", alert=not m["loss_equal"]))
        out += _search_facts(self.search)
        out += [Fact("Note", n) for n in self.notes]
        return tuple(out)

    def table_model(self, depth: int | None = None, columns=None, **_: Any) -> Table:
        return flat_table("parallel", f"layerscope parallel: {self.model_name}", self, self.roles, PARALLEL_COLUMNS,
                          name=lambda r: r.label, first_header="Ranks", context=self._context(),
                          footer=self._footer())

    def json_fields(self, **_: Any) -> tuple:
        return ("schema", "model_name", "options", "plans", "notes", "search",
                ("roles", "roles", ("label", "ranks")))

    def table(self, columns=None, width: int | None = None, **_: Any) -> str:
        return self._text(None, columns, True, width)

    def rich_table(self, columns=None, width: int | None = None, **_: Any):
        return self._rich(None, columns, True, width)

    def print(self, file: TextIO | None = None, columns=None, **_: Any) -> None:
        self._print(file, None, columns, True)
