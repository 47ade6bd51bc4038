"""The budgeted episode environment: one question over one SQLite database under one joint budget (DESIGN §3).

Gymnasium-style contract::

    env = BudgetedSQLEnv(token_counter=counter)
    observation, info = env.reset(task, budget)
    while True:
        result = env.step(policy_completion_text)       # StepResult(observation, reward, terminated, truncated, info)
        if result.terminated or result.truncated: break
    env.summary()  # EpisodeSummary;  env.turn_records  # list[TurnRecord];  env.messages  # live transcript

Rules (the ledger module states the accounting rules; this module applies them):

- Every completion is one action and costs one turn, valid or not; bad output becomes an invalid action with an
  explanatory observation, never an exception. ``answer`` / ``abstain`` terminate; the turn ceiling and context
  exhaustion truncate. Stepping a finished episode raises `EnvStateError`.
- Context: the live prompt is measured on the transcript (`Transcript`). ``info["max_completion_tokens"]`` is the
  headroom for the next completion; a longer completion exhausts the context (truncation; it never enters the
  transcript). Every observation is fitted to leave ``options.completion_reserve`` tokens free (rows / schema lines
  cut, with a note); if even a minimal observation cannot, the episode truncates. So a turn never starts over budget.
- execute_query: no query left → rejected (turn, no query). Otherwise the estimator runs internally (not charged, not
  shown), `Shield.preflight` may reject (no query), else `Shield.execute` runs under caps from the ledger, and the
  query, its VM steps and admitted result tokens are charged. A statement that fails before running (refused, or
  an SQL error caught while preparing) skips the preflight and costs no query; one that fails while running does.
  Every successful execution (even an empty result) becomes an evidence block.
- estimate_query / rewrite_query: the estimate runs under the remaining VM steps and its probe's VM steps are
  charged (no query); a WARNING line is shown (and counted) when a p95 exceeds what an execution could still admit.
  With ``options.estimate_view == "shuffled"`` (the placebo) the shown p50/p95 — and the warning computed from them —
  are another query's: a seeded draw (``reset(..., seed=)``, the task, the draw count) from a pool of estimates of
  canonical probe queries over the same database (each table's full listing, its COUNT(*), its single-column
  listings). Charges, the shield's preflight and its caps keep the true estimate.
- manage_evidence re-renders the block's original message in place (``info["context_rewritten"]``): archive →
  one-line stub, compress → profile (its tokens are controller tokens), discard → gone, restore → rows back,
  charging their result tokens again (refused if the result tokens or the context cannot take them).
- Reward: 1.0 for a budgeted success (correct and feasible) at termination, else 0.0.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from bapsql.budgets import Budget
from bapsql.db.rows import result_tokens
from bapsql.env import render
from bapsql.env.actions import (
    Abstain, AnswerAction, EstimateQuery, ExecuteQuery, InspectSchema, InvalidAction, ManageEvidence, RewriteQuery,
    parse_action,
)
from bapsql.env.evidence import EvidenceBlock, EvidenceStore, Profile
from bapsql.env.handles import DatabaseHandles
from bapsql.env.ledger import Ledger
from bapsql.env.outcome import gold_answer, summarize
from bapsql.env.records import EnvOptions, EpisodeSummary, StepResult, TurnDraft, TurnRecord
from bapsql.env.scoring import answers_match
from bapsql.env.transcript import GENERATION_PROMPT_TOKENS, Transcript
from bapsql.errors import EnvStateError
from bapsql.tokens import TokenCounter
from bapsql.types import Answer, Task

_TRAILER_TOKENS = 2  # <|im_end|> and the newline the template adds after a completion


class BudgetedSQLEnv:
    """The budgeted text-to-SQL episode (see the module docstring)."""

    def __init__(self, *, token_counter: TokenCounter, handles: DatabaseHandles | None = None,
                 options: EnvOptions = EnvOptions()) -> None:
        self.counter = token_counter
        self.handles = handles if handles is not None else DatabaseHandles(token_counter)
        self.options = options
        self._task: Task | None = None
        self._system: tuple[str, int] | None = None  # (system prompt, its context tokens), reused across episodes
        self._placebo_pools: dict[str, tuple] = {}  # database path -> estimates of canonical probe queries

    # -- public API ------------------------------------------------------------------------------------------------
    def reset(self, task: Task, budget: Budget, *, seed: int = 0) -> tuple[str, dict]:
        """Start an episode; returns the initial observation and info. `DatabaseError` if the DB cannot open.
        ``seed`` only seeds the placebo's draws (``estimate_view="shuffled"``); the environment is deterministic."""
        self._task = None  # a failed reset leaves no half-started episode behind
        self._seed, self._draws = int(seed), 0
        self._handle = self.handles.get(task.db_path)
        self._task, self._budget = task, budget
        self._ledger = Ledger(budget)
        self._store = EvidenceStore()
        self._tx = Transcript(self.counter, self._block_text)
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
        system = render.system_prompt(self.options.allowed_actions, show_budget=self.options.show_dashboard,
                                    style=self.options.prompt_style)
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
            if not isinstance(action, InvalidAction) and action.name not in self.options.allowed_actions:
                action = InvalidAction(action_text, f"the tool {action.name!r} is not available here")
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
                                         prompt_tokens=led.prompt_tokens - prompt_before, completion_tokens=completion))
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
        """Tokens the next completion may use (its end-of-turn tokens included in the accounting)."""
        return max(0, self._budget.context_tokens - self._tx.prompt() - _TRAILER_TOKENS)

    def summary(self) -> EpisodeSummary:
        """Every field of the episodes log table the environment knows."""
        if self._task is None:
            raise EnvStateError("call reset(task, budget) before summary()")
        return summarize(
            task=self._task, level=self._budget.level, ledger=self._ledger, store=self._store,
            answer=self._answer, citations=self._citations, gold=self._gold() if self._done else None,
            correct=self._correct, abstained=self._abstained, terminated=self.terminated, truncated=self.truncated,
            shield_breach=self._shield_breach, history=self._history, wall_s=time.perf_counter() - self._t0)

    # -- observations ----------------------------------------------------------------------------------------------
    def _block_text(self, ref: str) -> str:
        return render.block_body(self._store.get(ref))

    def _dashboard_text(self, role: str, content: str) -> str:
        """The dashboard line to append; its context figure is the headroom after this very message (a fixed
        point: found on the dashboard's own tokens, then confirmed by counting the whole message)."""
        if not self.options.show_dashboard:
            return ""
        snap = self._ledger.snapshot()
        free = snap.budget.context_tokens - self._tx.live() - GENERATION_PROMPT_TOKENS
        def line(g: int) -> str:
            return "\n" + render.dashboard(dataclasses.replace(snap.remaining, context_tokens=max(0, g)), snap.budget)

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

    def _fit(self, build: Callable[[int], tuple[str, str]], n: int, role: str = "tool"):
        """Largest k ≤ n whose observation ``build(k)`` = (head, body) + dashboard leaves the completion reserve
        free; returns (k, head, body, tail, tokens) or None when even k = 0 does not fit."""
        limit = self._budget.context_tokens - self.options.completion_reserve - GENERATION_PROMPT_TOKENS

        def attempt(k: int):
            head, body = build(k)
            tail = self._dashboard_text(role, head + body)
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

    # -- actions ---------------------------------------------------------------------------------------------------
    def _dispatch(self, action) -> tuple[TurnDraft, str | None]:
        if isinstance(action, InvalidAction):
            self._ledger.record_invalid_action()
            turn = TurnDraft("invalid", valid=False, message=action.reason)
            return turn, self._show(render.invalid_observation(action.reason, self.options.allowed_actions))
        if isinstance(action, InspectSchema):
            return self._inspect(action)
        if isinstance(action, (EstimateQuery, RewriteQuery)):
            return self._estimate(action)
        if isinstance(action, ExecuteQuery):
            return self._execute(action.sql)
        if isinstance(action, ManageEvidence):
            return self._manage(action)
        if isinstance(action, AnswerAction):
            self._answer, self._citations = action.to_answer(), action.citations
            self._correct = answers_match(self._answer, self._gold())
            self._finish(terminated=True)
            return TurnDraft("answer"), render.final_observation("answered", "The answer was recorded.")
        assert isinstance(action, Abstain)
        self._abstained = True
        self._finish(terminated=True)
        return TurnDraft("abstain", message=action.reason), render.final_observation("abstained", "")

    def _inspect(self, action: InspectSchema):
        catalog = self._handle.catalog
        lines, unknown = render.schema_detail_lines(catalog, action.tables)
        turn = TurnDraft("inspect_schema")
        fit = self._fit(lambda k: (render.schema_observation(lines[:k], unknown, catalog.table_names,
                                                             total=len(lines)), ""), len(lines))
        return turn, None if fit is None else self._append("tool", fit)

    def _exec_framing(self, ncols: int) -> int:
        """Context tokens an execution observation needs besides its result rows (header, note, dashboard,
        template overhead, generation prompt) plus the completion reserve."""
        key = (len(self._store), ncols)
        if key in self._framing:
            return self._framing[key]
        b = self._ledger.snapshot().budget
        fake = EvidenceBlock(f"E{len(self._store) + 1}", "", ("c",) * ncols, (), True, "result_tokens", 10**6,
                             "truncated", 0, Profile(0, True, None, ()), "visible", 0)
        text = (render.execution_header(fake) + "\n" + render.block_body(fake).split("\n")[-1] + "\n"
                + render.dashboard(b, b))
        extra = GENERATION_PROMPT_TOKENS + self.options.completion_reserve + 4  # 4: slack for joins at line ends
        self._framing[key] = self._tx.cost("tool", text) + extra
        return self._framing[key]

    def _warnings(self, est) -> list[str]:
        rem = self._ledger.remaining()
        caps = self._ledger.caps(context_reserve=self._exec_framing(len(est.columns)), rows=self.options.row_cap,
                                 bytes=self.options.byte_cap)
        over = []
        if est.result_tokens.p95 > caps.result_tokens:
            over.append(f"result tokens {est.result_tokens.p95:.0f} > {caps.result_tokens} admissible")
        if est.vm_steps.p95 > rem.vm_steps:
            over.append(f"VM steps {est.vm_steps.p95:.0f} > {rem.vm_steps} left")
        if est.rows.p95 > caps.rows:
            over.append(f"rows {est.rows.p95:.0f} > row cap {caps.rows}")
        if not over:
            return []
        return ["p95 exceeds what remains: " + "; ".join(over)
                + ". Rewrite it (aggregate, filter, LIMIT) or expect truncation."]

    def _estimate(self, action):
        rewrite = isinstance(action, RewriteQuery)
        name = "rewrite_query" if rewrite else "estimate_query"
        turn = TurnDraft(name, sql=action.sql)
        rem = self._ledger.remaining()
        if rem.vm_steps == 0:
            turn.status, turn.message = "rejected", "no VM steps left"
            return turn, self._show(render.no_vm_steps_left(name))
        true_est = self._handle.estimator.estimate(action.sql, vm_step_cap=rem.vm_steps)
        self._ledger.charge_probe(vm_steps=true_est.probe_vm_steps)
        if rewrite:
            self._ledger.record_rewrite()
        est = self._visible_estimate(true_est)
        warnings = [] if est.error else self._warnings(est)
        if warnings:
            self._ledger.record_warning()
        turn.internal_estimate = true_est
        turn.estimate, turn.warning, turn.status = est, bool(warnings), "error" if est.error else "ok"
        turn.message = est.error or ""
        label = "rewrite estimate" if rewrite else "estimate"
        return turn, self._show(render.estimate_observation(label, est, warnings))

    def _visible_estimate(self, est):
        """The estimate the policy is shown: the true one, or under the placebo another query's p50/p95."""
        if self.options.estimate_view == "true" or est.error:
            return est
        pool = self._placebo_pool()
        if not pool:
            return est
        import zlib

        import numpy as np

        rng = np.random.default_rng([self._seed & 0xFFFFFFFF, zlib.crc32(self._task.task_id.encode()), self._draws])
        self._draws += 1
        rows, tokens, steps = pool[int(rng.integers(len(pool)))]
        return dataclasses.replace(est, rows=rows, result_tokens=tokens, vm_steps=steps)

    def _placebo_pool(self) -> tuple:
        """(rows, result_tokens, vm_steps) quantiles of canonical probe queries over this database (cached)."""
        key = str(self._handle.path)
        if key not in self._placebo_pools:
            pool = []
            for t in self._handle.catalog.tables:
                q = f'"{t.name}"'
                sqls = [f"SELECT * FROM {q}", f"SELECT COUNT(*) FROM {q}",
                        *(f'SELECT "{c.name}" FROM {q}' for c in t.columns[:6])]
                for sql in sqls:
                    e = self._handle.estimator.estimate(sql, vm_step_cap=self.options.gold_vm_step_cap)
                    if not e.error:
                        pool.append((e.rows, e.result_tokens, e.vm_steps))
            self._placebo_pools[key] = tuple(pool)
        return self._placebo_pools[key]

    def _execute(self, sql: str):
        led, handle, opt = self._ledger, self._handle, self.options
        turn = TurnDraft("execute_query", sql=sql)
        rem = led.remaining()
        if rem.queries == 0:
            led.record_rejection()
            turn.status, turn.message = "rejected", "no queries left"
            return turn, self._show(render.no_query_left())
        est = handle.estimator.estimate(sql, vm_step_cap=rem.vm_steps)
        caps = led.caps(context_reserve=self._exec_framing(len(est.columns)), rows=opt.row_cap, bytes=opt.byte_cap)
        if caps.result_tokens == 0 and caps.vm_steps > 0 and not est.error:
            led.record_rejection()
            turn.status = "rejected"
            turn.message = (f"no result tokens can be admitted ({rem.result_tokens} result tokens left, the context "
                            "has no room for rows)")
            return turn, self._show(render.no_result_room(turn.message))
        res = None if est.error else handle.shield.preflight(est, caps)
        if res is None:
            res = handle.shield.execute(sql, caps)
        turn.internal_estimate, turn.shield, turn.status, turn.message = est, res, res.status, res.message
        self._shield_breach |= bool(res.breach)
        if res.status == "rejected" or (res.status == "error" and res.cost.vm_steps == 0):
            if res.status == "rejected":
                led.record_rejection()
            return turn, self._show(render.shield_observation(res))
        led.charge_execution(vm_steps=res.cost.vm_steps, result_tokens=res.cost.result_tokens)
        if res.status == "error":
            return turn, self._show(render.shield_observation(res))
        ref, rows = f"E{len(self._store) + 1}", tuple(res.rows)

        def block(k: int) -> EvidenceBlock:
            cut = k < len(rows)
            return EvidenceBlock(
                ref, sql, tuple(res.columns), rows[:k], res.status == "truncated" or cut,
                "context" if cut and res.truncated_by is None else res.truncated_by, res.rows_total,
                "truncated" if cut else res.status,
                result_tokens(res.columns, rows[:k], self.counter) if cut else res.cost.result_tokens,
                Profile.of(res.columns, rows[:k], truncated=cut or res.status == "truncated",
                           rows_total=res.rows_total), "visible", led.turns)

        fit = self._fit(lambda k: (render.execution_header(block(k)) + "\n", render.block_body(block(k))), len(rows))
        if fit is None:
            return turn, None
        b = block(fit[0])
        self._store.add(sql=sql, columns=b.columns, rows=b.rows, status=b.status, truncated=b.truncated,
                        truncated_by=b.truncated_by, rows_total=b.rows_total, result_tokens=b.result_tokens,
                        turn=b.turn)
        turn.ref = ref
        return turn, self._append("tool", fit, ref=ref, result_tokens=res.cost.result_tokens)

    def _manage(self, action: ManageEvidence):
        store, led, tx = self._store, self._ledger, self._tx
        turn = TurnDraft("manage_evidence", message=f"{action.op} {action.ref}")
        check = store.check(action.op, action.ref)
        block = store.get(action.ref)
        refusal = None if check.ok else check.message
        need = block.result_tokens if block is not None and action.op == "restore" else 0
        if refusal is None and need > led.remaining().result_tokens:
            refusal = f"cannot restore {block.ref}: it needs {need} result tokens, {led.remaining().result_tokens} left"
        if refusal is None:
            body = render.block_body(dataclasses.replace(block, state=check.after))
            delta = tx.delta_if(block.ref, body)
            text = render.evidence_observation(check, block, charged=need)
            limit = self._budget.context_tokens - self.options.completion_reserve - GENERATION_PROMPT_TOKENS
            if tx.live() + delta + tx.cost("tool", text + self._dashboard_text("tool", text)) > limit:
                refusal = (f"cannot {action.op} {block.ref}: the context cannot take {delta} more tokens; "
                           "archive or compress other evidence first")
        if refusal is not None:
            turn.status, turn.message = "refused", refusal
            return turn, self._show(f"manage_evidence refused: {refusal}")
        store.apply(action.op, action.ref)
        tx.rerender(block.ref)
        led.set_context(tx.prompt())
        turn.status, turn.ref, turn.rewritten = "ok", block.ref, True
        if action.op == "restore":
            led.charge_restore(result_tokens=need)
        elif action.op == "compress":
            led.charge_controller(self.counter.count(block.profile.render()))
        else:
            led.charge_prompt(self.counter.count(self._block_text(block.ref)))
        return turn, self._show(render.evidence_observation(check, block, charged=need))

    # -- bookkeeping -----------------------------------------------------------------------------------------------
    def _finish(self, *, terminated: bool = False, truncated: bool = False) -> None:
        self._done, self.terminated, self.truncated = True, terminated, truncated

    def _feasible(self) -> bool:
        return self._ledger.feasible and not self._shield_breach

    def _gold(self) -> Answer | None:
        if self._gold_cache is None:
            self._gold_cache = (gold_answer(self._task, self._handle.sandbox, self.options.gold_vm_step_cap),)
        return self._gold_cache[0]

    def _info(self, turn: TurnDraft) -> dict:
        return turn.info(self._ledger.snapshot(), max_completion_tokens=0 if self._done else self.max_completion_tokens,
                         terminated=self.terminated, truncated=self.truncated)


__all__ = ["BudgetedSQLEnv", "EnvOptions", "EpisodeSummary", "StepResult", "TurnRecord"]
