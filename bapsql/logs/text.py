"""What the turns log keeps of the text of an episode: the policy's completion and the env's observation per turn.

Schema v4 (`bapsql.logs.schema`) adds two nullable string columns to the turns table: ``completion`` (the policy's
completion for the turn exactly as the environment received it: a model policy's sampled text, a scripted policy's
action text) and ``observation`` (the observation the environment returned for that turn). They are what shows why an
action was invalid or a query was rejected.

Contract:

- `cap_text(text, limit)`: ``text`` itself when it has at most ``limit`` characters (default `TEXT_CAP_CHARS`,
  4,000), else its first characters followed by the marker ``…[+N chars]`` (N: the characters cut), the whole at
  most ``limit`` characters; None stays None. The environment caps each text when it records the turn
  (`bapsql.env.records.TurnDraft.record`) and the writer caps again whatever reaches it (rows from elsewhere), so a
  runaway completion cannot bloat the logs.
- `TextLogConfig` (YAML section ``log_text``, strict: an unknown key is a `ConfigError` naming it): ``mode: all``
  keeps the text of every episode, ``sample`` of a deterministic share of episodes (``share``, chosen by a hash of
  the episode id: a rerun or a resumed run keeps the same episodes' text), ``none`` of none (the columns are null).
- `keeps_text(episode_id, cfg)`: whether an episode's text is kept. Pure.
- `apply_text_policy(row, keep, limit)`: a turns row with its text columns capped (``keep``) or null (not
  ``keep``); the row itself when nothing changes, else a copy (the caller's dict is never modified). Pure.

Imports nothing from bapsql but the error types.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from bapsql.errors import ConfigError

TEXT_CAP_CHARS = 4_000  # the most characters a completion or observation keeps in the logs (each, per turn)
TEXT_COLUMNS: tuple[str, ...] = ("completion", "observation")
TEXT_MODES: tuple[str, ...] = ("all", "sample", "none")
_SALT = b"bapsql.log_text|"  # keeps the text sample independent of anything else keyed by episode ids


def cap_text(text: str | None, limit: int = TEXT_CAP_CHARS) -> str | None:
    """``text`` cut to at most ``limit`` characters with a ``…[+N chars]`` marker (module docstring)."""
    if text is None or len(text) <= limit:
        return text
    cut = len(text) - limit
    while True:  # the marker's own length depends on N: grow the cut until text + marker fit
        marker = f"…[+{cut} chars]"
        keep = max(0, limit - len(marker))
        if len(text) - keep == cut:
            return text[:keep] + marker
        cut = len(text) - keep


@dataclass(frozen=True)
class TextLogConfig:
    """Which episodes' completion / observation text the turns log keeps (module docstring). ``share``: the share
    of episodes kept under ``mode: sample`` (0 < share <= 1); ``max_chars``: the cap of each text (at most
    `TEXT_CAP_CHARS`, which the environment applies already)."""

    mode: Literal["all", "sample", "none"] = "all"
    share: float = 0.1
    max_chars: int = TEXT_CAP_CHARS

    def __post_init__(self) -> None:
        if self.mode not in TEXT_MODES:
            raise ConfigError(f"log_text.mode: must be one of {list(TEXT_MODES)}, got {self.mode!r}")
        if isinstance(self.share, bool) or not isinstance(self.share, (int, float)) or not 0 < self.share <= 1:
            raise ConfigError(f"log_text.share: must be a number in (0, 1], got {self.share!r}")
        if isinstance(self.max_chars, bool) or not isinstance(self.max_chars, int) \
                or not 64 <= self.max_chars <= TEXT_CAP_CHARS:
            raise ConfigError(f"log_text.max_chars: must be an integer in [64, {TEXT_CAP_CHARS}], "
                              f"got {self.max_chars!r}")


def text_fraction(episode_id: str) -> float:
    """A number in [0, 1) fixed by ``episode_id`` (blake2b: the same on every machine and Python)."""
    digest = hashlib.blake2b(_SALT + episode_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


def keeps_text(episode_id: str, cfg: TextLogConfig) -> bool:
    """Whether the turns of episode ``episode_id`` keep their text under ``cfg``."""
    if cfg.mode == "all":
        return True
    if cfg.mode == "none":
        return False
    return text_fraction(episode_id) < cfg.share


def apply_text_policy(row: Mapping[str, Any], keep: bool, limit: int = TEXT_CAP_CHARS) -> Mapping[str, Any]:
    """``row`` with its text columns capped at ``limit`` (``keep``) or null; ``row`` itself when unchanged."""
    changes = {}
    for name in TEXT_COLUMNS:
        value = row.get(name)
        if value is None:
            continue
        new = (cap_text(value, limit) if isinstance(value, str) else value) if keep else None
        if new is not value:
            changes[name] = new
    return {**row, **changes} if changes else row
