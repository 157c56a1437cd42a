"""The profiler's stderr hold-back (capture/measure.py): kineto's start/stop lines are dropped,
other output is passed on, and another Python thread stops it unless it is known to only draw a
spinner (the CLI's rich status thread)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert out.returncode == 0, out.stderr
    return out.stderr


def test_held_back_with_a_spinner_thread_only():
    code = """
        import os, threading, time
        from layerscope.capture.measure import kineto_quiet, quiet_safe_threads
        stop = threading.Event()
        t = threading.Thread(target=stop.wait, daemon=True)
        t.start()
        def kineto_and_other():
            os.write(2, b"USDT:2026 x SyncActivityProfilerHandler.cpp:52] profiler_start\\n")
            os.write(2, b"kept line\\n")
        with kineto_quiet():                   # an unknown thread runs: nothing is held back
            kineto_and_other()
        with quiet_safe_threads([t]), kineto_quiet():
            kineto_and_other()
        stop.set()
    """
    err = _run(code)
    assert err.count("USDT") == 1 and err.count("kept line") == 2
