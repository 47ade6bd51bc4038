"""Shared fixtures for the policy tests: the mini benchmark, warm database handles and an episode player."""

from __future__ import annotations

from pathlib import Path

import pytest

from bapsql.budgets import load_ladder
from bapsql.env.conditions import split_method
from bapsql.env.episode import BudgetedSQLEnv
from bapsql.env.handles import DatabaseHandles
from bapsql.env.records import EnvOptions
from bapsql.policies.registry import make_policy
from bapsql.rollout.runner import play_episode
from bapsql.tokens import load_token_counter
from tests.policies.minibench import build_minibench


@pytest.fixture(scope="session")
def minibench(tmp_path_factory) -> Path:
    return build_minibench(tmp_path_factory.mktemp("minibench"))


@pytest.fixture(scope="session")
def mini_tasks(minibench):
    from bapsql.data.load import load_benchmark

    return {t.task_id: t for t in load_benchmark(minibench).tasks}


@pytest.fixture(scope="session")
def counter():
    return load_token_counter("default")


@pytest.fixture(scope="session")
def handles(tmp_path_factory, counter):
    h = DatabaseHandles(counter, cache_dir=tmp_path_factory.mktemp("catalog-cache"))
    yield h
    h.close()


@pytest.fixture(scope="session")
def ladder():
    return load_ladder()


class Played:
    """One played episode: the completions the policy emitted, the infos it saw, the env and its summary."""

    def __init__(self, env, summary, completions, infos, messages, staged=frozenset()):
        self.env, self.summary, self.completions, self.infos, self.messages = env, summary, completions, infos, messages
        self.staged = set(staged)  # turns a scripted policy played only to set up a situation (kept out of SFT)

    @property
    def actions(self) -> list[str]:
        return [r.action for r in self.env.turn_records]


@pytest.fixture(scope="session")
def play(handles, counter, ladder):
    def run(policy, task, level="M", seed=0, condition=None, **env_options) -> Played:
        """Play ``policy`` (a name ``P`` or ``P@C``, or a policy) under ``condition`` (name or `Condition`;
        default: the name's condition, else full)."""
        cond = condition
        if isinstance(policy, str):
            name, in_name = split_method(policy)
            cond = cond if cond is not None else in_name
            policy = make_policy(name)
        budget = level if not isinstance(level, str) else ladder[level]
        env = BudgetedSQLEnv(token_counter=counter, handles=handles,
                             options=EnvOptions(**env_options).under(cond or "full"))
        completions, infos, messages = [], [], []

        def on_turn(msgs, text, info):
            messages.append(msgs)
            completions.append(text)
            infos.append(info)

        summary = play_episode(env, policy, task, budget, seed, on_turn=on_turn)
        return Played(env, summary, completions, infos, messages, getattr(policy, "staged_turns", frozenset()))

    return run
