"""A transient progress bar on stderr, for long work asked to show progress (``progress=True``)."""

from __future__ import annotations

__all__ = ["ProgressBar"]


class ProgressBar:
    """A transient progress bar on stderr (rich)."""

    def __init__(self, total: int, text: str) -> None:
        from rich.console import Console
        from rich.progress import Progress
        self._p = Progress(transient=True, console=Console(stderr=True))
        self._p.start()
        self._task = self._p.add_task(text, total=total)

    def advance(self) -> None:
        self._p.advance(self._task)

    def update(self, completed: int, text: str) -> None:
        """``completed`` of the total done, and the line beside the bar."""
        self._p.update(self._task, completed=completed, description=text)

    def close(self) -> None:
        self._p.stop()
