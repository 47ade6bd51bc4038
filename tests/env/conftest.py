"""Shared fixtures for the environment tests: a small real SQLite database built in tmp_path."""

from __future__ import annotations

from pathlib import Path

import pytest

from bapsql.env.episode import BudgetedSQLEnv
from bapsql.env.handles import DatabaseHandles
from bapsql.env.records import EnvOptions
from bapsql.tokens import RegexTokenCounter
from bapsql.types import Task
from tests.env.people_db import build_people_db


@pytest.fixture(scope="session")
def people_db(tmp_path_factory) -> Path:
    return build_people_db(tmp_path_factory.mktemp("db") / "people.sqlite")


@pytest.fixture(scope="session")
def handles(tmp_path_factory):
    h = DatabaseHandles(RegexTokenCounter(), cache_dir=tmp_path_factory.mktemp("cache"))
    yield h
    h.close()


@pytest.fixture
def make_env(handles):
    def make(**options) -> BudgetedSQLEnv:
        return BudgetedSQLEnv(token_counter=RegexTokenCounter(), handles=handles, options=EnvOptions(**options))

    return make


@pytest.fixture
def task(people_db) -> Task:
    return Task(task_id="t1", db_id="people", db_path=str(people_db),
                question="How many people live in Paris?",
                gold_sql="SELECT count(*) FROM person p JOIN city c ON p.city_id = c.id WHERE c.name = 'Paris'")
