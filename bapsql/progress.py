"""Progress of long work that a user watches: a rich bar on a terminal, plain lines in a log.

`Progress(console, description, total)` is a context manager with ``update(completed)`` / ``advance(n)``:

- ``console`` None: silent;
- a terminal console (``console.is_terminal``): a rich progress bar (description, bar, done/total, elapsed, time
  left), left on screen when it ends;
- any other console (a job under ``nohup``, CI, a file): rich draws nothing live there, so a plain line
  ``description: 12/126 (10%), elapsed 1.2 min, about 9.8 min left`` is printed whenever another ``step`` share
  of the total is done or ``interval_s`` seconds have passed since the last line, and once at the end.
"""

from __future__ import annotations

import time
from typing import Any


def progress_text(description: str, done: int, total: int, elapsed_s: float) -> str:
    """The plain progress line (see the module docstring)."""
    share = done / total if total else 1.0
    text = f"{description}: {done}/{total} ({100 * share:.0f}%), elapsed {elapsed_s / 60:.1f} min"
    if 0 < done < total:
        text += f", about {elapsed_s / done * (total - done) / 60:.1f} min left"
    return text


class Progress:
    """See the module docstring."""

    def __init__(self, console: Any, description: str, total: int, *, step: float = 0.05,
                 interval_s: float = 60.0) -> None:
        self.console, self.description, self.total = console, description, max(0, int(total))
        self.step, self.interval_s = step, interval_s
        self.done = 0
        self._bar = self._task = None
        self._t0 = self._last_t = time.monotonic()
        self._last_share = 0.0

    def __enter__(self) -> "Progress":
        return self.start()

    def start(self) -> "Progress":
        """Start the clock (and the bar on a terminal); `__enter__` does this."""
        self._t0 = self._last_t = time.monotonic()
        if self.console is not None and getattr(self.console, "is_terminal", False):
            from rich.progress import (BarColumn, MofNCompleteColumn, TimeElapsedColumn, TimeRemainingColumn)
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(),
                                     TimeElapsedColumn(), TimeRemainingColumn(), console=self.console)
            self._task = self._bar.add_task(self.description, total=self.total)
            self._bar.start()
        return self

    def update(self, completed: int | None = None, *, description: str | None = None) -> None:
        """Set the done count (and, optionally, a new description)."""
        if description is not None:
            self.description = description
        if completed is not None:
            self.done = int(completed)
        if self._bar is not None:
            self._bar.update(self._task, completed=self.done, description=self.description)
            return
        if self.console is None or not self.total:
            return
        now, share = time.monotonic(), self.done / self.total
        if share - self._last_share >= self.step or now - self._last_t >= self.interval_s:
            self._line(now)

    def advance(self, n: int = 1) -> None:
        self.update(self.done + n)

    def _line(self, now: float) -> None:
        self.console.print(progress_text(self.description, self.done, self.total, now - self._t0))
        self._last_t, self._last_share = now, self.done / self.total if self.total else 1.0

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def stop(self) -> None:
        """Stop the bar, or print the last line; `__exit__` does this."""
        if self._bar is not None:
            self._bar.stop()
        elif self.console is not None and self.total and self._last_share < 1.0 and self.done:
            self._line(time.monotonic())
