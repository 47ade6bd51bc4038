"""Bounded work for served episodes: a per-request deadline and cancellation (`EpisodeControl`) and a bounded
admission count with its ``Retry-After`` hint (`Admission`).

Contract:

- `EpisodeControl(deadline)` travels with one request (``deadline``: a ``time.perf_counter()`` instant, or ``None``).
  The episode calls ``check()`` between turns and ``wait(future)`` for each engine call: both raise
  `RequestTimeout` once the deadline has passed and `RequestCancelled` once ``cancel()`` was called (the client went
  away); ``wait`` wakes at once on either, withdrawing the engine request (``future.cancel()``). ``expire()`` ends the
  request as timed out from outside (the web app's own deadline); the first of ``cancel`` / ``expire`` / the
  deadline decides the ``outcome`` (``cancelled`` | ``timed_out``).
- `Admission(running, queued)` counts requests admitted and not finished: ``enter()`` is false once ``running +
  queued`` are in (the service answers 429), ``leave(seconds)`` frees a place and feeds the mean episode time that
  ``retry_after_s()`` turns into a hint: the expected wait for a place (mean episode time × (queued + 1) / running,
  rounded up, 1..60 s).
"""

from __future__ import annotations

import math
import threading
import time
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from bapsql.errors import RequestCancelled, RequestTimeout
from bapsql.logs.schema import SERVED_FAILURE_KINDS

CANCELLED, TIMED_OUT = SERVED_FAILURE_KINDS  # the failure kinds an episode stopped early is logged with


class EpisodeControl:
    """Deadline and cancellation of one served request (see the module docstring)."""

    def __init__(self, deadline: float | None = None, timeout_s: float | None = None):
        self.deadline, self.timeout_s = deadline, timeout_s
        self.outcome: str | None = None
        self._lock = threading.Lock()
        self._current: Future | None = None

    @classmethod
    def within(cls, timeout_s: float | None, start: float | None = None) -> "EpisodeControl":
        """A control whose deadline is ``timeout_s`` seconds after ``start`` (default: now); none when ``None``."""
        if timeout_s is None:
            return cls()
        return cls((time.perf_counter() if start is None else start) + timeout_s, timeout_s)

    def remaining(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.perf_counter()

    def cancel(self) -> None:
        """The client went away: stop the episode (its engine request is withdrawn now)."""
        self._end(CANCELLED)

    def expire(self) -> None:
        """The deadline passed (as measured elsewhere): stop the episode."""
        self._end(TIMED_OUT)

    def _end(self, outcome: str) -> None:
        with self._lock:
            if self.outcome is None:
                self.outcome = outcome
            current = self._current
        if current is not None:
            current.cancel()

    def error(self) -> Exception:
        """The error that ends this request (`RequestCancelled` or `RequestTimeout`)."""
        if self.outcome == CANCELLED:
            return RequestCancelled("the client went away; the episode was cancelled")
        limit = f"{self.timeout_s:g} s" if self.timeout_s is not None else "its limit"
        return RequestTimeout(f"the request ran past its deadline ({limit}, --request-timeout); its turns so far are "
                              "logged; ask again with a smaller budget, or later")

    def check(self) -> None:
        """Raise if the request was cancelled or its deadline passed."""
        remaining = self.remaining()
        if remaining is not None and remaining <= 0:
            self._end(TIMED_OUT)
        if self.outcome is not None:
            raise self.error()

    def wait(self, future: Future) -> Any:
        """The result of ``future`` (an engine request), unless the request ends first (see the module docstring)."""
        with self._lock:
            ended = self.outcome is not None
            if not ended:
                self._current = future
        if ended:
            future.cancel()
            raise self.error()
        try:
            remaining = self.remaining()
            return future.result(timeout=None if remaining is None else max(0.0, remaining))
        except FutureTimeout:
            self._end(TIMED_OUT)
            raise self.error() from None
        except CancelledError:
            if self.outcome is None:  # withdrawn by someone else: still this request's end
                self.outcome = CANCELLED
            raise self.error() from None
        finally:
            with self._lock:
                self._current = None


class Admission:
    """At most ``running + queued`` requests admitted at once (see the module docstring)."""

    def __init__(self, running: int, queued: int, *, first_guess_s: float = 1.0):
        self.running, self.queued = running, queued
        self._lock = threading.Lock()
        self._inside = 0
        self._mean_s = first_guess_s
        self.refused = 0

    @property
    def inside(self) -> int:
        return self._inside

    def enter(self) -> bool:
        with self._lock:
            if self._inside >= self.running + self.queued:
                self.refused += 1
                return False
            self._inside += 1
            return True

    def leave(self, seconds: float | None = None) -> None:
        with self._lock:
            self._inside = max(0, self._inside - 1)
            if seconds is not None and seconds >= 0:
                self._mean_s = 0.8 * self._mean_s + 0.2 * seconds

    def retry_after_s(self) -> int:
        with self._lock:
            waiting = max(0, self._inside - self.running)
            guess = self._mean_s * (waiting + 1) / max(1, self.running)
        return max(1, min(60, math.ceil(guess)))
