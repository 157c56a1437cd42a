"""What both launchers use to start torchrun and read its failures."""

from __future__ import annotations

__all__ = ["_free_port", "_worker_error"]


def _worker_error(text: str) -> str:
    """The workers' own exceptions (torchrun's summary at the end of stderr says only 'exit 1')."""
    import re
    errs = []
    for line in text.splitlines():
        m = re.match(r"\[rank(\d+)\]: ([\w.]*(?:Error|Exception)\b.*)", line)
        if m and "Connection closed by peer" not in m.group(2):
            errs.append(f"rank {m.group(1)}: {m.group(2)}")
    return "\n".join(dict.fromkeys(errs)) if errs else "\n".join(text.strip().splitlines()[-15:])


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
