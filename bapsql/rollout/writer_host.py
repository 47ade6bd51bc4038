"""The trajectory writer host behind the rollout's writer actor (`WriterHost`), and the `WriteAck` it answers with.

It is a plain class (split from `bapsql.rollout.workers`, the env worker): it imports no Ray;
`bapsql.rollout.ray_shell` wraps it in an actor, the in-process backend of the driver uses it directly, and tests
drive it without Ray.

- `WriterHost` owns a `bapsql.logs.writer.TrajectoryWriter`: dedups by episode id (ids on disk when it starts, and
  every id it accepted since), flushes every ``flush_episodes`` episodes or ``flush_s`` seconds, and acknowledges
  which episode ids are durable on disk, so the driver can resend only what a crashed writer lost. ``text`` (a
  `bapsql.logs.text.TextLogConfig`) is which episodes' turns keep their completion / observation text.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from bapsql.errors import ConfigError


@dataclass(frozen=True)
class WriteAck:
    """What a writer call did: rows ``accepted`` (new ids), ``duplicates`` dropped, the episode ids that became
    durable on disk during the call (``durable``), and which incarnation of the writer answered (a change means it
    was restarted and lost whatever it had buffered)."""

    accepted: int
    duplicates: int
    durable: tuple[str, ...]
    incarnation: str = ""


class WriterHost:
    """A deduplicating, periodically flushing `TrajectoryWriter` (see the module docstring)."""

    def __init__(self, run_dir: str | Path, run_name: str, *, flush_episodes: int = 256, flush_s: float = 15.0,
                 clock: Callable[[], float] = time.monotonic, text: Any = None):
        from bapsql.logs.text import TextLogConfig
        from bapsql.logs.writer import TrajectoryWriter, existing_episode_ids

        if flush_episodes < 1:
            raise ConfigError(f"flush_episodes must be at least 1, got {flush_episodes}")
        self.run_dir = Path(run_dir)
        self._writer = TrajectoryWriter(self.run_dir, run_name, flush_every=10**9,  # this class decides flushes
                                        text=text if text is not None else TextLogConfig())
        self._seen: set[str] = existing_episode_ids(self.run_dir)
        self._durable: set[str] = set(self._seen)
        self._buffered: list[str] = []
        self.flush_episodes = flush_episodes
        self.flush_s = flush_s
        self._clock = clock
        self._last_flush = clock()
        self.episodes_written = 0
        self.incarnation = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"

    def known(self) -> set[str]:
        """Every episode id on disk or accepted (the ids a resumed sweep skips)."""
        return set(self._seen)

    def write(self, items: Sequence[tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]]) -> WriteAck:
        """Buffer ``(episode_row, turn_rows)`` items whose ids are new; flush when due. Duplicates already on disk
        are acknowledged as durable (a resend after a crash must not wait for them forever)."""
        accepted = dup = 0
        already: list[str] = []
        for ep, turns in items:
            eid = ep["episode_id"]
            if eid in self._seen:
                dup += 1
                if eid in self._durable:
                    already.append(eid)
                continue
            self._writer.add_episode(ep, turns)
            self._seen.add(eid)
            self._buffered.append(eid)
            accepted += 1
        due = len(self._buffered) >= self.flush_episodes or self._clock() - self._last_flush >= self.flush_s
        return WriteAck(accepted, dup, tuple(already) + (self._flush() if due else ()), self.incarnation)

    def _flush(self) -> tuple[str, ...]:
        self._writer.flush()
        self._last_flush = self._clock()
        done, self._buffered = tuple(self._buffered), []
        self._durable.update(done)
        self.episodes_written += len(done)
        return done

    def flush(self) -> WriteAck:
        """Write everything buffered now."""
        return WriteAck(0, 0, self._flush(), self.incarnation)

    def close(self) -> WriteAck:
        """Flush and close the writer."""
        ack = self.flush()
        self._writer.close()
        return ack

    def files(self) -> list[str]:
        return [str(p) for p in self._writer.files]
