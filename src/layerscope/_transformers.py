"""What layerscope does around transformers' own machinery (its logging) while it builds a model from a
config: nothing process-wide, nothing another thread can observe."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Iterator

__all__ = ["quiet_token_ids"]


@contextlib.contextmanager
def quiet_token_ids(user_keys) -> Iterator[None]:
    """transformers warns (once per message) that a special token id is outside the vocabulary: so it is
    when a preset's vocabulary is shrunk (--set vocab_size=128 on gpt2's bos/eos 50256), which the analysis
    does not use. Dropped here, for the ids the user did not set, from this thread's records only, on the
    one logger that logs it: the filter is scoped, and another thread's warnings pass. (transformers shows
    each such message once a process, ``warning_once``: one dropped here is not shown later either.)"""
    me = threading.get_ident()

    def keep(record) -> bool:
        msg = record.getMessage() if record.thread == me else ""
        name = msg[len("Model config: "):].partition(" ")[0]
        return not (msg.startswith("Model config: ") and name.endswith("_token_id") and name not in user_keys
                    and "must be `None` or an integer within the vocabulary" in msg)
    log = logging.getLogger("transformers.configuration_utils")
    log.addFilter(keep)
    try:
        yield
    finally:
        log.removeFilter(keep)
