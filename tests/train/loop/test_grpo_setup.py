"""`bapsql.train.loop.grpo_setup`: the GRPO stage's parts are closed together, each even when one before it fails."""

from __future__ import annotations

import pytest

from bapsql.train.loop.grpo_setup import GRPOSetup


class Part:
    def __init__(self, name: str, log: list[str], fail: bool = False):
        self.name, self.log, self.fail = name, log, fail

    def close(self) -> None:
        self.log.append(self.name)
        if self.fail:
            raise RuntimeError(f"{self.name} failed to close")


def test_close_closes_monitor_rollouts_then_learner():
    log: list[str] = []
    GRPOSetup(learner=Part("learner", log), rollouts=Part("rollouts", log), trainer=None,
              monitor=Part("monitor", log)).close()
    assert log == ["monitor", "rollouts", "learner"]


def test_a_failing_close_still_closes_the_rest_and_surfaces():
    log: list[str] = []
    setup = GRPOSetup(learner=Part("learner", log), rollouts=Part("rollouts", log, fail=True), trainer=None,
                      monitor=Part("monitor", log, fail=True))
    with pytest.raises(RuntimeError, match="failed to close"):
        setup.close()
    assert log == ["monitor", "rollouts", "learner"]


def test_a_local_learner_without_close_is_fine():
    log: list[str] = []
    GRPOSetup(learner=object(), rollouts=Part("rollouts", log), trainer=None, monitor=Part("monitor", log)).close()
    assert log == ["monitor", "rollouts"]


def test_parts_not_built_yet_are_skipped():
    """`build_grpo` closes what it had built when a later part fails to build (monitor and rollouts still None)."""
    log: list[str] = []
    GRPOSetup(learner=Part("learner", log), rollouts=None, trainer=None, monitor=None).close()
    assert log == ["learner"]
