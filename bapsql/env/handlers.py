"""The action handlers of the budgeted episode (`bapsql.env.episode.BudgetedSQLEnv` mixes them in).

Each handler applies one typed action under the episode's condition (`bapsql.env.conditions`) and returns
``(TurnDraft, observation or None)`` (None: the observation does not fit the context, the episode truncates).
The accounting rules are those of the episode module's docstring; the condition-specific parts live here:

- a tool the condition does not offer is an invalid action whose observation names the condition's tools;
- ``estimates: permuted`` shows the payload the placebo pool (`bapsql.env.placebo`) assigns to this request (every
  estimate/rewrite turn is a request, refused ones too), the warning is computed from the shown numbers, the shield
  keeps the true estimate;
- ``rewrite: rule`` replaces the policy's rewrite by the rule-based rewrite of the candidate last estimated (and runs
  the rule-based SQL when the policy later executes its own rewrite);
- ``preflight: words`` turns a preflight rejection into words without a single number — in the observation and in
  every message a policy can read (``info``), so no abstention reason a policy writes can quote the estimate;
- a hidden dashboard (``raw``) hides the ledger: refusals say "no result room left" / "no context room left" in
  words, and no message quotes the remaining result tokens, context or VM steps;
- ``posthoc``: the controller (`bapsql.env.posthoc`) decides how an executed result is rendered; admitted result
  tokens are what it renders.

The shield's internal estimate of an execution (its preflight) runs the estimator's probe: its measured VM steps are
charged like an estimate's (no query), before the statement runs under what is left.
"""

from __future__ import annotations

import dataclasses

from bapsql.db.estimator import Quantiles
from bapsql.db.rows import result_tokens
from bapsql.env import render
from bapsql.env.actions import (
    Abstain, AnswerAction, EstimateQuery, ExecuteQuery, InspectSchema, InvalidAction, ManageEvidence, RewriteQuery,
)
from bapsql.env.evidence import EvidenceBlock, Profile
from bapsql.env.posthoc import ResultProfiler, decide, shape_of
from bapsql.env.records import TurnDraft
from bapsql.env.rewriter import DEFAULT_K, affordable_rows, deterministic_rewrite
from bapsql.env.scoring import answers_match


class ActionHandlers:
    """The handlers (see the module docstring); state lives on the episode that mixes this class in."""

    def _dispatch(self, action) -> tuple[TurnDraft, str | None]:
        cond = self.options.condition
        if not isinstance(action, InvalidAction) and not cond.offers(action.name):
            action = InvalidAction(action.name, f"the tool {action.name!r} is not offered under the condition "
                                                f"{cond.name!r}")
        if isinstance(action, InvalidAction):
            self._ledger.record_invalid_action()
            turn = TurnDraft("invalid", valid=False, message=action.reason)
            return turn, self._show(render.invalid_observation(action.reason, cond.actions))
        if isinstance(action, InspectSchema):
            return self._inspect(action)
        if isinstance(action, (EstimateQuery, RewriteQuery)):
            return self._estimate(action)
        if isinstance(action, ExecuteQuery):
            return self._execute(self._substitutes.get(action.sql.strip(), action.sql))
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

    # -- estimates -------------------------------------------------------------------------------------------------
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
        extra = self.framing.generation_prompt_tokens + self.options.completion_reserve + 4  # 4: slack at line ends
        self._framing[key] = self._tx.cost("tool", text) + extra
        return self._framing[key]

    def _caps(self, ncols: int):
        return self._ledger.caps(context_reserve=self._exec_framing(ncols), rows=self.options.row_cap,
                                 bytes=self.options.byte_cap)

    def _warnings(self, est) -> list[str]:
        rem = self._ledger.remaining()
        caps = self._caps(len(est.columns))
        shown = self.options.show_dashboard  # a hidden dashboard: no ledger figure in the warning
        over = []
        if est.result_tokens.p95 > caps.result_tokens:
            over.append(f"result tokens {est.result_tokens.p95:.0f} > "
                        + (f"{caps.result_tokens} admissible" if shown else "what can be admitted"))
        if est.vm_steps.p95 > rem.vm_steps:
            over.append(f"VM steps {est.vm_steps.p95:.0f} > " + (f"{rem.vm_steps} left" if shown else "what is left"))
        if est.rows.p95 > caps.rows:
            over.append(f"rows {est.rows.p95:.0f} > row cap {caps.rows}")
        if not over:
            return []
        return ["p95 exceeds what remains: " + "; ".join(over)
                + ". Rewrite it (aggregate, filter, LIMIT) or expect truncation."]

    def _estimate(self, action):
        rewrite = isinstance(action, RewriteQuery)
        name = "rewrite_query" if rewrite else "estimate_query"
        sql = action.sql
        if rewrite and self.options.condition.rewrite == "rule":
            sql = self._rule_rewrite(action.sql)
        turn = TurnDraft(name, sql=sql)
        request = self._requests  # every estimate/rewrite turn is a request, refused ones too (placebo.is_request)
        self._requests += 1
        rem = self._ledger.remaining()
        if rem.vm_steps == 0:
            turn.status, turn.message = "rejected", "no VM steps left"
            return turn, self._show(render.no_vm_steps_left(name))
        if self._busy(turn):
            return turn, self._show(render.busy_observation(turn.action, turn.message))
        true_est = self._handle.estimator.estimate(sql, vm_step_cap=rem.vm_steps)
        self._ledger.charge_probe(vm_steps=true_est.probe_vm_steps)
        if rewrite:
            self._ledger.record_rewrite()
        est = self._visible_estimate(true_est, request)
        if not true_est.error:
            self._candidate, self._candidate_est = sql, est
        warnings = [] if est.error else self._warnings(est)
        if warnings:
            self._ledger.record_warning()
        turn.internal_estimate = true_est
        turn.estimate, turn.warning, turn.status = est, bool(warnings), "error" if est.error else "ok"
        turn.message = est.error or ""
        label = "rewrite estimate" if rewrite else "estimate"
        if sql != action.sql:
            label = f"rule-based rewrite ({sql})\n{label}"
        return turn, self._show(render.estimate_observation(label, est, warnings))

    def _rule_rewrite(self, policy_sql: str) -> str:
        """``rewrite: rule``: the rule-based rewrite of the candidate last estimated (the policy's SQL when none),
        with a row allowance from that candidate's shown estimate; remembered so executing the policy's rewrite
        runs it."""
        base = self._candidate or policy_sql
        k = DEFAULT_K
        if self._candidate_est is not None and not self._candidate_est.error:
            est = self._candidate_est
            k = affordable_rows(est.rows.p95, est.result_tokens.p95, self._ledger.remaining().result_tokens)
        rule_sql = deterministic_rewrite(base, k).sql
        self._substitutes[policy_sql.strip()] = rule_sql
        return rule_sql

    def _visible_estimate(self, est, request: int = 0):
        """The estimate the policy is shown: the true one, or under the placebo the payload assigned to this
        episode's ``request``-th estimate request (`bapsql.env.placebo`; a level without recorded payloads raises
        `ConfigError`, never shows the truth)."""
        if self.options.condition.estimates != "permuted" or est.error:
            return est
        if self.placebo is None:
            from bapsql.errors import ConfigError

            raise ConfigError(f"condition {self.options.condition.name!r} shows permuted estimates: give the env a "
                              "PlaceboPool (the runner records one in a first pass; see bapsql.env.placebo)")
        shown = self.placebo.shown(self._budget.level, (self._task.task_id, self._seed, request))
        rows, tokens, steps = (Quantiles(*q) for q in shown)
        return dataclasses.replace(est, rows=rows, result_tokens=tokens, vm_steps=steps)

    # -- execution -------------------------------------------------------------------------------------------------
    def _execute(self, sql: str):
        led, handle, opt = self._ledger, self._handle, self.options
        cond = opt.condition
        turn = TurnDraft("execute_query", sql=sql)
        rem = led.remaining()
        if rem.queries == 0:
            led.record_rejection()
            turn.status, turn.message = "rejected", "no queries left"
            return turn, self._show(render.no_query_left())
        if self._busy(turn):
            return turn, self._show(render.busy_observation(turn.action, turn.message))
        est = handle.estimator.estimate(sql, vm_step_cap=rem.vm_steps)
        led.charge_probe(vm_steps=est.probe_vm_steps)  # the shield's preflight probe is database work too
        caps = self._caps(len(est.columns))
        if caps.result_tokens == 0 and caps.vm_steps > 0 and not est.error:
            led.record_rejection()
            turn.status = "rejected"
            turn.message = (f"no result tokens can be admitted ({rem.result_tokens} result tokens left, the context "
                            "has no room for rows)") if opt.show_dashboard else render.no_room(
                "result_tokens" if rem.result_tokens == 0 else "context")
            return turn, self._show(render.no_result_room(turn.message))
        res = None if est.error else handle.shield.preflight(est, caps)
        profiler = ResultProfiler() if cond.posthoc != "none" else None
        if res is None:
            res = handle.shield.execute(sql, caps, observe=profiler)
        words = render.preflight_words(res.rejection) if res.status == "rejected" else None
        if words is not None and cond.preflight == "words":  # nothing the policy sees quotes the estimate
            res = dataclasses.replace(res, message=words)
        turn.internal_estimate, turn.shield, turn.status, turn.message = est, res, res.status, res.message
        self._shield_breach |= bool(res.breach)
        if res.status == "rejected" or (res.status == "error" and res.cost.vm_steps == 0):
            if res.status == "rejected":
                led.record_rejection()
                led.charge_probe(vm_steps=res.cost.vm_steps)  # a lock lost mid-run (busy) still spent its steps
            text = render.shield_observation(res, numbers=cond.preflight == "numbers")
            return turn, self._show(text)
        if res.status == "error":
            led.charge_execution(vm_steps=res.cost.vm_steps, result_tokens=0)
            return turn, self._show(render.shield_observation(res))
        if not opt.show_dashboard and res.status == "truncated":  # its message quotes the caps (the ledger)
            res = dataclasses.replace(res, message=render.shield_message_words(res))
            turn.shield, turn.message = res, res.message
        self._executed.append(sql)
        return self._admit(turn, sql, res, caps, profiler)

    def _admit(self, turn: TurnDraft, sql: str, res, caps, profiler: ResultProfiler | None):
        """Render an executed result into the context (post-hoc control applied) and charge it."""
        led, cond = self._ledger, self.options.condition
        ref, rows = f"E{len(self._store) + 1}", tuple(res.rows)
        count = self.counter.count
        row_tokens = (lambda k: res.cost.result_tokens if k == len(rows) else result_tokens(res.columns, rows[:k],
                                                                                             self.counter))

        def block(k: int, state: str = "visible", profile: Profile | None = None) -> EvidenceBlock:
            cut = k < len(rows)
            return EvidenceBlock(
                ref, sql, tuple(res.columns), rows[:k], res.status == "truncated" or cut,
                "context" if cut and res.truncated_by is None else res.truncated_by, res.rows_total,
                "truncated" if cut else res.status, row_tokens(k),
                profile or Profile.of(res.columns, rows[:k], truncated=cut or res.status == "truncated",
                                      rows_total=res.rows_total), state, led.turns)

        def parts(b: EvidenceBlock, note: str = "") -> tuple[str, str]:  # (header, body) as the observation shows them
            return render.execution_header(b) + "\n", render.block_body(b) + ("\n" + note if note else "")

        def admitted_tokens(b: EvidenceBlock) -> int:
            """The result tokens charged when ``b`` is the block shown."""
            if b.state == "compressed":
                return count(render.block_body(b))
            if cond.posthoc != "none":
                return b.result_tokens  # what the controller rendered
            return res.cost.result_tokens  # what the shield admitted (rows cut to fit the context included)

        def spend(b: EvidenceBlock) -> dict[str, int]:  # the execution's charge, shown on this turn's dashboard
            return {"queries": 1, "vm_steps": res.cost.vm_steps, "result_tokens": admitted_tokens(b)}

        fit = self._fit(lambda kk: parts(block(kk)), len(rows), spend=lambda kk: spend(block(kk)))
        if fit is None:
            led.charge_execution(vm_steps=res.cost.vm_steps, result_tokens=0)
            return turn, None
        k, note = fit[0], ""
        chosen = block(k)
        if cond.posthoc != "none":
            whole = profiler.profile(res.columns, complete=res.truncated_by != "vm_steps")
            prefix = render.block_body(block(0, "compressed", Profile(0, False, 0, ()))).split("]")[0] + "] "
            mode, spent = cond.posthoc, 0
            cut = res.status == "truncated" or k < len(rows)
            if mode == "adaptive" and self.controller is not None and cut:
                choice = self.controller.choose(shape_of(
                    rows_total=res.rows_total, columns=res.columns, admitted=len(rows), rows_fit=k,
                    full_result_tokens=res.full_result_tokens, profile=whole, allowance=caps.result_tokens,
                    truncated_by=res.truncated_by, count=count))
                mode, spent = ("none" if choice.control == "pass" else choice.control), (
                    choice.prompt_tokens + choice.completion_tokens)
            d = decide(mode, status=res.status, truncated_by=res.truncated_by, admitted=len(rows),
                       rows_fit=k, limit=self.options.posthoc_limit, profile=whole, allowance=caps.result_tokens,
                       count=lambda text: count(prefix + text))
            led.charge_controller(spent)
            turn.posthoc = d.control
            note = d.note
            if d.control == "profile":
                chosen = dataclasses.replace(block(len(rows), "compressed", d.profile), result_tokens=row_tokens(
                    len(rows)))
                fit = self._fit(lambda _k: parts(chosen, note), 0, spend=lambda _k: spend(chosen))
            elif d.control == "limit" and d.rows < k:
                chosen = block(d.rows)
                fit = self._fit(lambda _k: parts(chosen, note), d.rows, spend=lambda _k: spend(chosen))
            elif note:
                fit = self._fit(lambda kk: parts(block(kk), note), k, spend=lambda kk: spend(block(kk)))
            if fit is None:
                led.charge_execution(vm_steps=res.cost.vm_steps, result_tokens=0)
                return turn, None
            if d.control != "profile":
                chosen = block(fit[0])
        admitted = admitted_tokens(chosen)
        led.charge_execution(vm_steps=res.cost.vm_steps, result_tokens=admitted)
        if note:
            led.charge_controller(count(note))
        self._store.add(sql=sql, columns=chosen.columns, rows=chosen.rows, status=chosen.status,
                        truncated=chosen.truncated, truncated_by=chosen.truncated_by, rows_total=chosen.rows_total,
                        result_tokens=chosen.result_tokens, turn=chosen.turn, state=chosen.state,
                        profile=chosen.profile if chosen.state == "compressed" else None)
        turn.ref = ref
        turn.profile = chosen.profile if chosen.state == "compressed" else None
        return turn, self._append("tool", fit, ref=ref, result_tokens=admitted + (count(note) if note else 0))

    # -- evidence --------------------------------------------------------------------------------------------------
    def _manage(self, action: ManageEvidence):
        store, led, tx = self._store, self._ledger, self._tx
        turn = TurnDraft("manage_evidence", message=f"{action.op} {action.ref}")
        check = store.check(action.op, action.ref)
        block = store.get(action.ref)
        refusal = None if check.ok else check.message
        need = block.result_tokens if block is not None and action.op == "restore" else 0
        shown = self.options.show_dashboard  # a hidden dashboard: refusals without ledger figures
        if refusal is None and need > led.remaining().result_tokens:
            refusal = (f"cannot restore {block.ref}: it needs {need} result tokens, {led.remaining().result_tokens} "
                       "left") if shown else f"cannot restore {block.ref}: {render.no_room('result_tokens')}"
        if refusal is None:
            body = render.block_body(dataclasses.replace(block, state=check.after))
            delta = tx.delta_if(block.ref, body)
            text = render.evidence_observation(check, block, charged=need, show_budget=shown)
            limit = (self._budget.context_tokens - self.options.completion_reserve
                     - self.framing.generation_prompt_tokens)
            if tx.live() + delta + tx.cost("tool", text + self._dashboard_text("tool", text)) > limit:
                room = f"the context cannot take {delta} more tokens" if shown else render.no_room("context")
                refusal = f"cannot {action.op} {block.ref}: {room}; archive or compress other evidence first"
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
        return turn, self._show(render.evidence_observation(check, block, charged=need, show_budget=shown))


__all__ = ["ActionHandlers"]
