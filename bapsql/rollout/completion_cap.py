"""Whether a split's gold answers fit the completion cap: the new tokens a policy may write in one turn.

An ``answer`` call carries every value of the answer in a single turn. A task whose gold answer call is longer than
the engine's ``max_tokens`` cannot be answered by any policy under that cap. Its completion is cut, the call does not
parse, and the episode ends out of turns, however right its SQL was. Issue 34 met this silently: with 96 new tokens a
turn, 23 of the binding mix's 55 `test` answer calls did not fit (the longest is 195 SmolLM2 tokens).

`check_completion_cap` measures each task's gold answer call, rendered as a policy would write it (`gold_answer_call`:
the canonical tool call with one citation), with the policy's own tokenizer. It is a lower bound on what the turn
needs: a model that writes text before its call needs more. `cap_warning` renders the result for the user. The sweep
(`bapsql.rollout.sweep`) and GRPO (`bapsql.train.recipe.pipeline`) print it before any episode runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from bapsql.env.actions import AnswerAction, render_action
from bapsql.tokens import TokenCounter, load_token_counter
from bapsql.types import Task

log = logging.getLogger(__name__)
CITATION = "E1"  # the evidence id a policy's answer cites; every answer call carries at least one


@dataclass(frozen=True)
class CapCheck:
    """How the gold answers of some tasks compare with a completion cap of ``cap`` new tokens.

    ``answered``: tasks with a gold answer (the others are skipped). ``over``: ids of the tasks whose gold answer call
    needs more than ``cap`` tokens, longest first. ``longest``: tokens of the longest gold answer call (0 when no task
    has a gold answer)."""

    cap: int
    answered: int
    over: tuple[str, ...]
    longest: int

    @property
    def fits(self) -> bool:
        """Whether every gold answer call fits the cap."""
        return not self.over


def gold_answer_call(task: Task) -> str | None:
    """The ``answer`` tool call that states the task's gold answer, citing one evidence block; None without one."""
    if task.gold is None:
        return None
    return render_action(AnswerAction(task.gold.kind, task.gold.values, (CITATION,)))


def check_completion_cap(tasks: Iterable[Task], counter: TokenCounter, cap: int) -> CapCheck:
    """Count, with ``counter`` (the policy's tokenizer), the tasks whose gold answer call exceeds ``cap`` tokens."""
    if cap < 1:
        raise ValueError(f"cap: the new tokens a turn must be at least 1, got {cap}")
    sizes = {t.task_id: counter.count(call) for t in tasks if (call := gold_answer_call(t)) is not None}
    over = sorted((tid for tid, n in sizes.items() if n > cap), key=lambda tid: (-sizes[tid], tid))
    return CapCheck(cap=cap, answered=len(sizes), over=tuple(over), longest=max(sizes.values(), default=0))


def cap_warning(check: CapCheck, *, where: str, key: str) -> str | None:
    """The warning to show for ``check`` (None when every answer fits). ``where`` names the tasks (e.g. "`test`")
    and ``key`` the setting that holds the cap (e.g. ``eval.max_new_tokens``)."""
    if check.fits:
        return None
    shown = ", ".join(check.over[:3]) + (", ..." if len(check.over) > 3 else "")
    return (f"{len(check.over)} of {check.answered} {where} gold answers need more than {check.cap} new tokens in "
            f"their answer call (longest {check.longest}: {shown}), so no policy can answer them; raise {key} to at "
            f"least {check.longest} unless that is the point.")


def warn_completion_cap(tasks: Iterable[Task], model_dir: str | Path, cap: int, *, where: str, key: str,
                        say: Callable[[str], None] | None = None) -> CapCheck | None:
    """`check_completion_cap` with the tokenizer of the model folder ``model_dir``, then its warning logged and, when
    ``say`` (a callable taking one string) is given, shown. Returns the check; None, checking nothing, when the folder
    holds no ``tokenizer.json`` (a served model's name, a test double)."""
    if not (Path(str(model_dir)) / "tokenizer.json").is_file():
        return None
    check = check_completion_cap(tasks, load_token_counter(str(model_dir)), cap)
    msg = cap_warning(check, where=where, key=key)
    if msg is not None:
        log.warning(msg)
        if say is not None:
            say(msg)
    return check
