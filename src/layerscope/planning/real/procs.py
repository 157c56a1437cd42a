"""What both launchers use to start torchrun and read its failures."""

from __future__ import annotations

import os
import re
import signal
import subprocess

__all__ = ["_free_port", "_worker_error", "run_torchrun"]


# what a process that dies of a signal says before it goes (an uncaught C++ exception in a worker
# thread, glog's fatal checks, glibc's heap checks, CPython's fault handler)
_FATAL = re.compile(r"terminate called|what\(\):|Fatal Python error|Segmentation fault|double free|corrupted|"
                    r"^\[F\d|Check failed")


def _worker_error(text: str) -> str:
    """The workers' own exceptions (torchrun's summary at the end of stderr says only 'exit 1'), and
    what a rank that died of a signal (SIGABRT, SIGSEGV) printed before it went."""
    errs = []
    for line in text.splitlines():
        m = re.match(r"\[rank(\d+)\]: ([\w.]*(?:Error|Exception)\b.*)", line)
        if m and "Connection closed by peer" not in m.group(2):
            errs.append(f"rank {m.group(1)}: {m.group(2)}")
            continue
        m = re.match(r"(?:\[rank(\d+)\]: )?(.*)", line)
        if _FATAL.search(m.group(2)):
            errs.append((f"rank {m.group(1)}: " if m.group(1) else "") + m.group(2).strip())
    return "\n".join(dict.fromkeys(errs)) if errs else "\n".join(text.strip().splitlines()[-15:])


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_torchrun(cmd: list[str], timeout: float, env: dict) -> subprocess.CompletedProcess:
    """``cmd`` (torch.distributed.run and its workers) in a session of its own, its output captured; past
    ``timeout`` seconds every process of that session is killed (subprocess.run would kill torchrun
    alone, and leave its workers, hung on a collective, running) and TimeoutExpired raised."""
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
