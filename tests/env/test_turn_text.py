"""The completion and observation of each turn reach the turns log (bapsql/env/records.py, schema v4): an invalid
action's text explains itself in the Parquet table, read back from a real episode on a real SQLite database."""

from __future__ import annotations

from bapsql.budgets import get_budget
from bapsql.env.actions import AnswerAction, ExecuteQuery, render_action
from bapsql.logs.reader import read_turns
from bapsql.logs.text import TEXT_CAP_CHARS, TextLogConfig
from bapsql.logs.writer import TrajectoryWriter, episode_id
from bapsql.rollout.groups import EpisodeSpec, episode_rows, group_id

PARIS = "SELECT count(*) FROM person p JOIN city c ON p.city_id = c.id WHERE c.name = 'Paris'"
MALFORMED = "SELECT * FROM t"  # SQL, but no tool call: an invalid action


def _log(env, task, out, *, text=TextLogConfig(), run="text"):
    """Log the finished episode of ``env`` as the runner does (episode_rows → TrajectoryWriter) into ``out``."""
    eid = episode_id(run, "model.m@full", "S", 0, task.task_id)
    spec = EpisodeSpec(eid, run, "model.m@full", "S", 0, 0, 0, task, group_id(task.task_id, "S", 0))
    ep, turns = episode_rows(spec, env.summary(), env.turn_records)
    with TrajectoryWriter(out, run, text=text) as w:
        w.add_episode(ep, turns)
    return read_turns(out).sort_values("turn").reset_index(drop=True)


def _play(env, task):
    env.reset(task, get_budget("S"))
    observations = [env.step(MALFORMED).observation, env.step(render_action(ExecuteQuery(PARIS))).observation,
                    env.step(render_action(AnswerAction("scalar", (120,), ("E1",)))).observation]
    return observations


def test_an_invalid_actions_completion_and_observation_are_in_the_turns_table(make_env, task, tmp_path):
    env = make_env()
    observations = _play(env, task)
    turns = _log(env, task, tmp_path)
    assert list(turns["action"]) == ["invalid", "execute_query", "answer"]
    bad = turns.iloc[0]
    assert not bad["valid"] and bad["completion"] == MALFORMED
    assert bad["observation"] == observations[0] and "tool" in bad["observation"].lower()
    assert turns.iloc[1]["completion"] == render_action(ExecuteQuery(PARIS))
    assert list(turns["observation"]) == observations  # each turn's own observation, the final one included
    assert "E1 (ok)" in turns.iloc[1]["observation"]


def test_a_none_setting_leaves_the_text_columns_null(make_env, task, tmp_path):
    env = make_env()
    _play(env, task)
    turns = _log(env, task, tmp_path, text=TextLogConfig(mode="none"))
    assert len(turns) == 3 and turns["completion"].isna().all() and turns["observation"].isna().all()
    assert list(turns["action"]) == ["invalid", "execute_query", "answer"]  # the rest of the row is logged


def test_a_runaway_completion_is_capped_in_the_record(make_env, task):
    """A completion longer than the context headroom truncates the episode; its record keeps a capped text."""
    env = make_env()
    env.reset(task, get_budget("XS"))
    runaway = "SELECT " + "name, " * 20_000
    r = env.step(runaway)
    assert r.truncated
    (rec,) = env.turn_records
    assert len(rec.completion) == TEXT_CAP_CHARS and rec.completion.startswith("SELECT name, name, ")
    assert rec.completion.endswith(f"…[+{len(runaway) - rec.completion.index('…[+')} chars]")
    assert rec.observation == r.observation and "exceeds the context headroom" in rec.observation
    assert rec.to_row()["completion"] == rec.completion  # the record's row carries the text columns
