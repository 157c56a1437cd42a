"""A rank's entry point (``python -m layerscope.torchrun FILE`` under torchrun): the model and plan
built from the spec, the rank's work handed to ``pipeline.run``."""

from __future__ import annotations

import json

from ..planning.config import PartitionOptions
from ..planning.real.pipeline_run import run_rank
from .setup import build_setup

__all__ = ["worker"]


def worker(cfg_path: str) -> None:
    """One rank of a run (torchrun starts this module with the settings ``launch()`` wrote): the
    model and plan built from the spec here, the rank's work in ``pipeline.run``."""
    with open(cfg_path) as f:
        cfg = json.load(f)
    if cfg.get("kind") == "parallel":
        from .parallel import parallel_worker
        parallel_worker(cfg)
        return
    opts = PartitionOptions(**cfg["options"])
    run_rank(lambda: build_setup(cfg["spec"], opts), opts, cfg["out"])
