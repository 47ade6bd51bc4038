"""A few whole trajectories per (method, budget level), one row per turn: the table a run monitor (W&B) shows after
an evaluation, so what a policy wrote and what it was told can be read beside the success curves.

- `select_episodes(episodes, per_cell=4, successes=2)`: pure. In each (method, budget) cell, up to ``successes``
  successful episodes and up to ``per_cell - successes`` failed ones; when one kind has too few, the other fills
  the cell up to ``per_cell``. Within a kind, episodes are taken in `selection_key` order (a hash of the task id,
  then seed, sample and episode id): deterministic, independent of the order the rows come in, and — the task
  first — the same questions come back from one round to the next (validation after each update) where their
  outcome allows. Cells come in method order, then ladder order of levels (XS, S, M, L; others after, by name).
- `trajectory_rows(episodes, turns_by_episode, display_chars)`: the table's rows for chosen episodes, one per turn
  in turn order: method, level, task_id, episode_id, turn, action, valid, status, completion, observation (both cut
  to ``display_chars`` with a marker, `bapsql.logs.text.cap_text`), then the episode's success and reward on each
  of its rows.
- `trajectory_table(pairs, ...)`: both over (episode row, turn rows) pairs (e.g. `Trajectory.episode` / ``.turns``).
- `run_trajectory_table(run_dirs, ...)`: both over a run's Parquet logs; only the chosen episodes' turns are read.
  Their text is what the run's ``log_text`` setting kept (null where it kept none).

Episode rows need ``method``, ``budget``, ``task_id``, ``episode_id``, ``success`` (``seed``, ``sample``,
``reward`` when present); turn rows the turns-table columns named above. Imports nothing from bapsql above the logs.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from bapsql.logs.text import cap_text

TABLE_NAME = "eval/trajectories"  # the monitor table of an evaluation sweep (`bapsql.rollout.sweep.run_sweep`)
VALIDATION_TABLE_NAME = "val/trajectories"  # the in-loop validation's (`bapsql.train.loop.validation.Validator`)
PER_CELL = 4
SUCCESSES = 2
DISPLAY_CHARS = 1_000  # characters of a completion / observation shown in a table cell
_LADDER = ("XS", "S", "M", "L")  # the budget ladder's order (bapsql.budgets.LEVELS; not imported: logs stay low)
COLUMNS: tuple[str, ...] = ("method", "level", "task_id", "episode_id", "turn", "action", "valid", "status",
                            "completion", "observation", "success", "reward")
_EPISODE_COLUMNS = ("episode_id", "method", "budget", "task_id", "seed", "sample", "success", "reward")
_TURN_COLUMNS = ("episode_id", "turn", "action", "valid", "status", "completion", "observation")


def selection_key(episode: Mapping[str, Any]) -> tuple:
    """The order episodes of one cell and kind are taken in (module docstring)."""
    task = str(episode["task_id"])
    h = hashlib.blake2b(task.encode("utf-8"), digest_size=8).hexdigest()
    return h, task, int(episode.get("seed") or 0), int(episode.get("sample") or 0), str(episode["episode_id"])


def _level_key(level: str) -> tuple:
    return (_LADDER.index(level), "") if level in _LADDER else (len(_LADDER), level)


def select_episodes(episodes: Iterable[Mapping[str, Any]], *, per_cell: int = PER_CELL,
                    successes: int = SUCCESSES) -> list[Mapping[str, Any]]:
    """Up to ``per_cell`` episodes per (method, budget) cell, ``successes`` of them successful when there are
    enough (module docstring). `ValueError` unless 0 <= successes <= per_cell."""
    if per_cell < 0 or not 0 <= successes <= per_cell:
        raise ValueError(f"need 0 <= successes <= per_cell, got successes={successes}, per_cell={per_cell}")
    cells: dict[tuple[str, str], tuple[list, list]] = defaultdict(lambda: ([], []))
    methods: dict[str, None] = {}
    for e in episodes:
        methods.setdefault(str(e["method"]), None)
        cells[(str(e["method"]), str(e["budget"]))][0 if e["success"] else 1].append(e)
    order = {m: i for i, m in enumerate(sorted(methods))}
    out: list[Mapping[str, Any]] = []
    for key in sorted(cells, key=lambda k: (order[k[0]], _level_key(k[1]))):
        wins, losses = (sorted(kind, key=selection_key) for kind in cells[key])
        n_win = min(len(wins), max(successes, per_cell - len(losses)))
        n_loss = min(len(losses), per_cell - n_win)
        out += wins[:n_win] + losses[:n_loss]
    return out


def trajectory_rows(episodes: Sequence[Mapping[str, Any]], turns_by_episode: Mapping[str, Sequence[Mapping]], *,
                    display_chars: int = DISPLAY_CHARS) -> list[dict[str, Any]]:
    """The table rows of ``episodes`` (in their order), one per turn (module docstring)."""
    rows = []
    for e in episodes:
        eid = str(e["episode_id"])
        reward = e.get("reward")
        for t in sorted(turns_by_episode.get(eid, ()), key=lambda t: int(t["turn"])):
            rows.append({
                "method": e["method"], "level": e["budget"], "task_id": e["task_id"], "episode_id": eid,
                "turn": int(t["turn"]), "action": t["action"], "valid": bool(t["valid"]), "status": t.get("status"),
                "completion": cap_text(t.get("completion"), display_chars),
                "observation": cap_text(t.get("observation"), display_chars),
                "success": bool(e["success"]), "reward": None if reward is None else float(reward)})
    return rows


def trajectory_table(pairs: Iterable[tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]], *,
                     per_cell: int = PER_CELL, successes: int = SUCCESSES,
                     display_chars: int = DISPLAY_CHARS) -> list[dict[str, Any]]:
    """The table of (episode row, turn rows) ``pairs``: `select_episodes`, then `trajectory_rows`."""
    pairs = list(pairs)
    chosen = select_episodes((e for e, _ in pairs), per_cell=per_cell, successes=successes)
    ids = {str(e["episode_id"]) for e in chosen}
    turns = {str(e["episode_id"]): ts for e, ts in pairs if str(e["episode_id"]) in ids}
    return trajectory_rows(chosen, turns, display_chars=display_chars)


def run_trajectory_table(run_dirs: str | Path | Iterable[str | Path], *, per_cell: int = PER_CELL,
                         successes: int = SUCCESSES, display_chars: int = DISPLAY_CHARS) -> list[dict[str, Any]]:
    """The table of the runs' Parquet logs (`bapsql.logs.reader`); only the chosen episodes' turns are read."""
    from bapsql.logs.reader import read_table

    episodes = read_table(run_dirs, "episodes", columns=list(_EPISODE_COLUMNS)).to_pylist()
    chosen = select_episodes(episodes, per_cell=per_cell, successes=successes)
    if not chosen:
        return []
    ids = {str(e["episode_id"]) for e in chosen}
    turns: dict[str, list[dict]] = defaultdict(list)
    for t in read_table(run_dirs, "turns", columns=list(_TURN_COLUMNS), episode_ids=ids).to_pylist():
        turns[t["episode_id"]].append(t)
    for eid, ts in turns.items():  # a turn written twice (a rerun after a crash) is kept once: the last written
        turns[eid] = list({t["turn"]: t for t in ts}.values())
    return trajectory_rows(chosen, turns, display_chars=display_chars)
