"""The budgeted episode environment: one question over one SQLite database under one joint budget (DESIGN §3).

Gymnasium-style contract::

    env = BudgetedSQLEnv(token_counter=counter)
    observation, info = env.reset(task, budget)
    while True:
        result = env.step(policy_completion_text)       # StepResult(observation, reward, terminated, truncated, info)
        if result.terminated or result.truncated: break
    env.summary()  # EpisodeSummary (official_ex: unbudgeted EX of the final SQL);  env.turn_records  # list[TurnRecord];  env.messages  # live transcript

Rules (the ledger module states the accounting rules; this module applies them):

- Every completion is one action and costs one turn, valid or not; bad output becomes an invalid action with an
  explanatory observation, never an exception. ``answer`` / ``abstain`` terminate; the turn ceiling and context
  exhaustion truncate. Stepping a finished episode raises `EnvStateError`.
- Context: the live prompt is measured on the transcript (`Transcript`). ``info["max_completion_tokens"]`` is the
  headroom for the next completion; a longer completion exhausts the context (truncation; it never enters the
  transcript). Every observation is fitted to leave ``options.completion_reserve`` tokens free (rows / schema lines
  cut, with a note); if even a minimal observation cannot, the episode truncates. So a turn never starts over budget.
- execute_query: no query left → rejected (turn, no query). Otherwise the shield's internal estimate runs (not shown;
  its probe's VM steps are charged, no query), `Shield.preflight` may reject (no query), else `Shield.execute` runs
  under caps from the ledger, and the query, its VM steps and admitted result tokens are charged. A statement that
  fails before running (refused, or an SQL error caught while preparing) skips the preflight and costs no query; one
  that fails while running does. Every successful execution (even an empty result) becomes an evidence block; under a
  post-hoc condition the controller decides how it is rendered (`bapsql.env.posthoc`).
- estimate_query / rewrite_query: the estimate runs under the remaining VM steps and its probe's VM steps are
  charged (no query); a WARNING line is shown (and counted) when a p95 exceeds what an execution could still admit.
  Under ``estimates: permuted`` (the placebo) the shown p50/p95 — and the warning computed from them — are the payload
  the `PlaceboPool` assigns to the request; charges, the preflight and its caps keep the true estimate.
- Live databases (`bapsql.env.live`): the first database action opens the episode's read snapshot (all its queries,
  its gold answer and its official EX read one committed state); a writer's lock held past
  ``options.busy_timeout_s`` makes that turn a ``busy`` rejection (no query charged), and the turn record carries the
  time waited (``db_wait_s``).
- The condition (`EnvOptions.condition`, `bapsql.env.conditions`) decides the tools offered (the system prompt lists
  only those; any other is an invalid action), the dashboard, the estimate view, the preflight wording, the rewriter
  and the post-hoc controller. The handlers are in `bapsql.env.handlers`.
- manage_evidence re-renders the block's original message in place (``info["context_rewritten"]``): archive →
  one-line stub, compress → profile (its tokens are controller tokens), discard → gone, restore → rows back,
  charging their result tokens again (refused if the result tokens or the context cannot take them).
- Reward: 1.0 for a budgeted success (correct and feasible) at termination, else 0.0.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Callable, Mapping

from bapsql.budgets import Budget
from bapsql.db.shield import busy_result
from bapsql.env import render
from bapsql.env.actions import parse_action
from bapsql.env.evidence import EvidenceStore
from bapsql.env.handlers import ActionHandlers
from bapsql.env.handles import DatabaseHandles
from bapsql.env.ledger import Ledger
from bapsql.env.live import EpisodeSnapshot
from bapsql.env.outcome import final_sql, gold_answer, official_ex, official_rows, summarize
from bapsql.env.records import EnvOptions, EpisodeSummary, StepResult, TurnDraft, TurnRecord
from bapsql.env.transcript import Transcript, framing_of
from bapsql.errors import EnvStateError
from bapsql.tokens import TokenCounter
from bapsql.types import Answer, Task

if TYPE_CHECKING:  # pragma: no cover
    from bapsql.env.placebo import PlaceboPool
    from bapsql.env.posthoc import Controller


class BudgetedSQLEnv(ActionHandlers):
    """The budgeted text-to-SQL episode (see the module docstring; the action handlers are in
    `bapsql.env.handlers`). ``placebo``: the `PlaceboPool` a ``permuted``-estimates condition shows from;
    ``controller``: a model-backed post-hoc `Controller` for the ``adaptive`` control (None: the rule-based one)."""

    def __init__(self, *, token_counter: TokenCounter, handles: DatabaseHandles | None = None,
                 options: EnvOptions = EnvOptions(), placebo: "PlaceboPool | None" = None,
                 controller: "Controller | None" = None) -> None:
        self.counter = token_counter
        self.framing = framing_of(token_counter)  # the policy's chat-template overheads (`bapsql.models.framing`)
        self.handles = handles if handles is not None else DatabaseHandles(token_counter)
        self.options = options
        self.placebo = placebo
        self.controller = controller
        self._task: Task | None = None
        self._system: tuple[str, int] | None = None  # (system prompt, its context tokens), reused across episodes
        self._official: dict[tuple[str, str], frozenset | None] = {}  # (db, sql) -> unbudgeted result rows

    # -- public API ------------------------------------------------------------------------------------------------
    def reset(self, task: Task, budget: Budget, *, seed: int = 0) -> tuple[str, dict]:
        """Start an episode; returns the initial observation and info. `DatabaseError` if the DB cannot open.
        ``seed`` only keys the placebo's assignment (``estimates: permuted``); the environment is deterministic."""
        self._task = None  # a failed reset leaves no half-started episode behind
        self._seed, self._requests = int(seed), 0
        if getattr(self, "_snapshot", None) is not None:  # live databases: an unfinished previous episode's hold
            self._snapshot.release()
        self._release_handle()
        self._candidate: str | None = None  # the SQL last estimated (the rule-based rewriter's input)
        self._candidate_est = None
        self._substitutes: dict[str, str] = {}  # policy rewrite -> rule-based SQL (``rewrite: rule``)
        self._executed: list[str] = []  # SQL that ran, in order (official EX uses the final one)
        self._handle = self.handles.acquire(task.db_path)
        self._leased = task.db_path
        self._snapshot = EpisodeSnapshot(self._handle.sandbox, busy_timeout_s=self.options.busy_timeout_s,
                                         request_wall_s=self.options.request_wall_s)
        self._official_ex_value: bool | None = None
        self._task, self._budget = task, budget
        self._ledger = Ledger(budget)
        self._store = EvidenceStore()
        self._tx = Transcript(self.counter, self._block_text, self.framing)
        self._records: list[TurnRecord] = []
        self._done = self.terminated = self.truncated = False
        self._answer: Answer | None = None
        self._citations: tuple[str, ...] = ()
        self._abstained = False
        self._correct = False
        self._shield_breach = False
        self._history: list[tuple[str, str | None]] = []  # (action, status) per turn
        self._gold_cache: tuple[Answer | None] | None = None
        self._framing: dict[tuple[int, int], int] = {}
        self._t0 = time.perf_counter()
        cond = self.options.condition
        system = render.system_prompt(cond.actions, show_budget=cond.show_dashboard, style=self.options.prompt_style)
        if self._system is None or self._system[0] != system:
            self._system = (system, self._tx.cost("system", system))
        system_tokens = self._tx.append("system", system, tokens=self._system[1])
        catalog = self._handle.catalog
        n = len(catalog.tables)
        fit = self._fit(lambda k: (render.initial_observation(task, catalog, max_tables=None if k >= n else k), ""),
                        n, "user")
        if fit is None:  # nothing is sent to the policy: no prompt is charged and the episode is over
            observation = render.final_observation("truncated", "The question and schema do not fit the context.")
            self._finish(truncated=True)
        else:
            observation = self._append("user", fit)
            self._ledger.charge_prompt(system_tokens)
            self._ledger.set_context(self._tx.prompt())
        return observation, self._info(TurnDraft("reset"))

    def step(self, action_text: str) -> StepResult:
        """Apply one completion (a tool call) and return the next observation."""
        if self._task is None:
            raise EnvStateError("call reset(task, budget) before step()")
        if self._done:
            raise EnvStateError("the episode is over; call reset() to start a new one")
        led, tx = self._ledger, self._tx
        before, ctx_before, prompt_before = led.snapshot(), tx.prompt(), led.prompt_tokens
        completion = self.counter.count(action_text)
        max_completion = self.max_completion_tokens
        led.charge_completion(completion)
        led.consume_turn()
        action = parse_action(action_text)
        if completion > max_completion:
            turn = TurnDraft(action.name, valid=False, message="context exhausted")
            observation = render.final_observation(
                "truncated", f"The completion ({completion} tokens) exceeds the context headroom ({max_completion}).")
            self._finish(truncated=True)
        else:
            tx.append("assistant", action_text)
            led.set_context(tx.live())
            turn, observation = self._dispatch(action)
            if not self._done:
                if observation is None:
                    observation = render.final_observation("truncated", "The context budget is exhausted.")
                    self._finish(truncated=True)
                else:
                    led.set_context(tx.prompt())
                    if led.turns >= self._budget.turns:
                        observation += "\n" + render.final_observation("truncated", "No turns left.")
                        self._finish(truncated=True)
        self._history.append((turn.action, turn.status))
        self._records.append(turn.record(before, led.snapshot(), ctx_before=ctx_before, ctx_after=led.context_tokens,
                                         prompt_tokens=led.prompt_tokens - prompt_before, completion_tokens=completion,
                                         completion=action_text, observation=observation))
        reward = 1.0 if self.terminated and self._correct and self._feasible() else 0.0
        return StepResult(observation, reward, self.terminated, self.truncated, self._info(turn))

    @property
    def messages(self) -> list[dict]:
        """The live transcript: system, the initial user message, then assistant / tool turns (current states)."""
        return self._tx.messages()

    @property
    def ledger(self) -> Ledger:
        return self._ledger

    @property
    def evidence(self) -> EvidenceStore:
        return self._store

    @property
    def turn_records(self) -> list[TurnRecord]:
        return list(self._records)

    @property
    def done(self) -> bool:
        return self._done

    @property
    def max_completion_tokens(self) -> int:
        """Tokens the next completion may use (the template's closing after it, e.g. its end-of-turn token, is
        reserved)."""
        return max(0, self._budget.context_tokens - self._tx.prompt() - self.framing.trailer_tokens)

    def summary(self) -> EpisodeSummary:
        """Every field of the episodes log table the environment knows."""
        if self._task is None:
            raise EnvStateError("call reset(task, budget) before summary()")
        return summarize(
            task=self._task, level=self._budget.level, ledger=self._ledger, store=self._store,
            answer=self._answer, citations=self._citations, gold=self._gold() if self._done else None,
            correct=self._correct, abstained=self._abstained, terminated=self.terminated, truncated=self.truncated,
            shield_breach=self._shield_breach, history=self._history, wall_s=time.perf_counter() - self._t0,
            official_ex=self._official_ex_value if self._done else None)

    # -- observations ----------------------------------------------------------------------------------------------
    def _block_text(self, ref: str) -> str:
        return render.block_body(self._store.get(ref))

    def _dashboard_text(self, role: str, content: str, spend: Mapping[str, int] | None = None) -> str:
        """The dashboard line to append; its context figure is the headroom after this very message (a fixed
        point: found on the dashboard's own tokens, then confirmed by counting the whole message). ``spend``: what
        this very turn will still charge once the message is chosen (an execution's query, VM steps and admitted
        result tokens), so the line shows the ledger after the turn, as the info's ledger does."""
        if not self.options.show_dashboard:
            return ""
        snap = self._ledger.snapshot()
        left = dataclasses.replace(snap.remaining, **{ch: max(0, getattr(snap.remaining, ch) - int(v))
                                                      for ch, v in (spend or {}).items()})
        free = snap.budget.context_tokens - self._tx.live() - self.framing.generation_prompt_tokens
        def line(g: int) -> str:
            return "\n" + render.dashboard(dataclasses.replace(left, context_tokens=max(0, g)), snap.budget)

        body = self._tx.cost(role, content)
        guess = free - body
        for _ in range(4):
            actual = free - body - self.counter.count(line(guess))
            if actual == guess:
                break
            guess = actual
        for _ in range(3):  # confirm on the whole message (tokenizers may merge across the newline)
            actual = free - self._tx.cost(role, content + line(guess))
            if actual == guess:
                break
            guess = actual
        return line(guess)

    def _fit(self, build: Callable[[int], tuple[str, str]], n: int, role: str = "tool",
             spend: Callable[[int], Mapping[str, int]] | None = None):
        """Largest k ≤ n whose observation ``build(k)`` = (head, body) + dashboard leaves the completion reserve
        free; returns (k, head, body, tail, tokens) or None when even k = 0 does not fit. ``spend(k)``: what the
        turn charges when k is chosen (`_dashboard_text`)."""
        limit = self._budget.context_tokens - self.options.completion_reserve - self.framing.generation_prompt_tokens

        def attempt(k: int):
            head, body = build(k)
            tail = self._dashboard_text(role, head + body, spend(k) if spend is not None else None)
            tokens = self._tx.cost(role, head + body + tail)
            return (k, head, body, tail, tokens) if self._tx.live() + tokens <= limit else None

        best = attempt(n)
        if best is not None or n == 0:
            return best
        lo, hi, best = 0, n - 1, None
        while lo <= hi:
            mid = (lo + hi) // 2
            got = attempt(mid)
            if got is not None:
                best, lo = got, mid + 1
            else:
                hi = mid - 1
        return best

    def _append(self, role: str, fit, *, ref: str | None = None, result_tokens: int = 0) -> str:
        _k, head, body, tail, tokens = fit
        if ref:
            self._tx.append(role, head, ref=ref, tail=tail, tokens=tokens)
        else:
            self._tx.append(role, head + body + tail, tokens=tokens)
        self._ledger.charge_prompt(max(0, tokens - result_tokens))
        return head + body + tail

    def _show(self, text: str) -> str | None:
        """Fit and append a plain text observation (None: the context is exhausted)."""
        fit = self._fit(lambda k: (text, ""), 0)
        return None if fit is None else self._append("tool", fit)

    # -- bookkeeping -----------------------------------------------------------------------------------------------
    def _busy(self, turn: TurnDraft) -> bool:
        """Live databases (`bapsql.env.live`): hold the episode's read snapshot before its first database action.
        True when a writer's lock outlasted the bounded wait: the turn is then a 'busy' rejection (a typed
        ``rejected`` / ``busy`` shield result carrying the wait)."""
        waited, busy = self._snapshot.join()
        if busy is None:
            turn.db_wait_s += waited
            return False
        self._ledger.record_rejection()
        turn.shield, turn.status, turn.message = busy_result(busy), "rejected", str(busy)
        return True

    def _finish(self, *, terminated: bool = False, truncated: bool = False) -> None:
        self._done, self.terminated, self.truncated = True, terminated, truncated
        self._gold()  # read now: the snapshot the episode read (`bapsql.env.live`), and before the handle's lease ends
        self._official_ex_value = self._official_ex()
        self._snapshot.release()
        self._release_handle()

    def _release_handle(self) -> None:
        """End the episode's lease on its database handle (`DatabaseHandles.acquire`; idempotent)."""
        if getattr(self, "_leased", None) is not None:
            self.handles.release(self._leased)
            self._leased = None

    def _feasible(self) -> bool:
        return self._ledger.feasible and not self._shield_breach

    def _gold(self) -> Answer | None:
        if self._gold_cache is None:
            self._gold_cache = (gold_answer(self._task, self._handle.sandbox, self.options.gold_vm_step_cap),)
        return self._gold_cache[0]

    def _official_ex(self) -> bool | None:
        """BIRD's unbudgeted EX of the episode's final SQL (`bapsql.env.outcome.final_sql`) against the gold SQL:
        False when no query ran or the final SQL fails (`official_ex`); None only when the gold SQL is missing or
        cannot run. Results are cached per (database, SQL)."""
        sql = final_sql(self._citations, self._store, self._executed)
        if not self._task.gold_sql.strip():
            return None
        gold = self._official_rows(self._task.gold_sql)
        return None if gold is None else official_ex(None if sql is None else self._official_rows(sql), gold)

    def _official_rows(self, sql: str) -> frozenset | None:
        key = (str(self._handle.path), sql)
        if key not in self._official:
            if len(self._official) > 4096:
                self._official.clear()
            self._official[key] = official_rows(self._handle.sandbox, sql, self.options.gold_vm_step_cap)
        return self._official[key]

    def _info(self, turn: TurnDraft) -> dict:
        return turn.info(self._ledger.snapshot(), max_completion_tokens=0 if self._done else self.max_completion_tokens,
                         terminated=self.terminated, truncated=self.truncated)


__all__ = ["BudgetedSQLEnv", "EnvOptions", "EpisodeSummary", "StepResult", "TurnRecord"]
