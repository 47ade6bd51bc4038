"""The versioned pyarrow schema of the trajectory logs (DESIGN §6).

Two tables per run, each a Parquet dataset partitioned by ``method`` and ``budget``:

- ``episodes``: one row per episode (the unit of every statistic in `bapsql.analysis`).
- ``turns``: one row per turn (action, SQL, estimates vs actuals, ledger before/after, token counts, and since v4
  the completion and observation text, kept as the run's ``log_text`` setting says: `bapsql.logs.text`).

Bump `SCHEMA_VERSION` on any change and keep readers tolerant of older versions (new columns nullable).
Categorical fields use the vocabularies below so that analysis code can rely on them.
"""

from __future__ import annotations

import pyarrow as pa

# 2: the condition column (methods are POLICY@CONDITION); 3: turn latency split (served); 4: turn text (completion,
# observation; bapsql.logs.text)
SCHEMA_VERSION = 4

# Why an unsuccessful episode failed (empty string for successes). Used by the failure taxonomy of the analysis.
FAILURE_KINDS: tuple[str, ...] = (
    "",  # success
    "terminal_rejection",  # the last meaningful action was a shield rejection and no answer followed
    "unjustified_abstention",  # abstained although the gold answer was reachable within the budget
    "justified_abstention_wrong",  # abstained on a task that needed an answer (kept separate for clarity)
    "wrong_with_sufficient_evidence",  # answered wrong although visible evidence supported the gold answer
    "insufficient_evidence",  # answered wrong without visible evidence supporting the gold answer
    "malformed_answer",  # the answer action could not be parsed into the task's answer type
    "out_of_turns",  # the turn ceiling (or another channel) truncated the episode before an answer
    "invalid_actions",  # truncated after only invalid actions
)

# Why a served episode (bapsql serve) stopped before its end: its client went away, or it ran past its deadline.
# Kept apart from FAILURE_KINDS (the outcomes of episodes that ran to their end); the writer accepts both.
SERVED_FAILURE_KINDS: tuple[str, ...] = ("cancelled", "timed_out")

ACTIONS: tuple[str, ...] = (
    "inspect_schema",
    "estimate_query",
    "rewrite_query",
    "execute_query",
    "manage_evidence",
    "answer",
    "abstain",
    "invalid",
)

EPISODES_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int16(), nullable=False),
        pa.field("run", pa.string(), nullable=False),
        pa.field("episode_id", pa.string(), nullable=False),  # deterministic: hash of (run, method, budget, seed, task, sample)
        pa.field("group_id", pa.string(), nullable=False),  # (task, budget[, policy version]) rollout group
        pa.field("sample", pa.int32(), nullable=False),  # index within the group (0 for plain evaluation)
        pa.field("method", pa.string(), nullable=False),  # POLICY@CONDITION
        pa.field("condition", pa.string()),  # the condition part of the method (bapsql.env.conditions); v2
        pa.field("budget", pa.string(), nullable=False),  # level name: XS, S, M, L or a custom probe name
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("db_id", pa.string(), nullable=False),
        pa.field("answer", pa.string()),  # JSON of the typed answer, null when none was given
        pa.field("gold", pa.string()),  # JSON of the typed gold answer
        pa.field("correct", pa.bool_(), nullable=False),
        pa.field("feasible", pa.bool_(), nullable=False),
        pa.field("success", pa.bool_(), nullable=False),  # Budgeted Success = correct and feasible
        pa.field("official_ex", pa.bool_()),  # unbudgeted execution accuracy of the final SQL, when computed
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("evidence_score", pa.float64(), nullable=False),
        pa.field("queries", pa.int64(), nullable=False),
        pa.field("result_tokens", pa.int64(), nullable=False),
        pa.field("vm_steps", pa.int64(), nullable=False),
        pa.field("turns", pa.int64(), nullable=False),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("completion_tokens", pa.int64(), nullable=False),
        pa.field("total_tokens", pa.int64(), nullable=False),  # prompt + completion + result + controller
        pa.field("peak_context", pa.int64(), nullable=False),  # largest live prompt over the episode
        pa.field("warnings", pa.int64(), nullable=False),  # policy-visible estimator warnings
        pa.field("rewrites", pa.int64(), nullable=False),
        pa.field("rejections", pa.int64(), nullable=False),  # shield preflight rejections
        pa.field("invalid_actions", pa.int64(), nullable=False),
        pa.field("abstained", pa.bool_(), nullable=False),
        pa.field("terminated", pa.bool_(), nullable=False),  # ended by answer/abstain
        pa.field("truncated", pa.bool_(), nullable=False),  # ended by an exhausted channel or the turn ceiling
        pa.field("breach", pa.bool_(), nullable=False),  # audit flag: any hard breach (must stay false)
        pa.field("failure", pa.string(), nullable=False),  # one of FAILURE_KINDS
        pa.field("policy_version", pa.int64(), nullable=False),
        pa.field("wall_s", pa.float64(), nullable=False),
    ]
)

TURNS_SCHEMA = pa.schema(
    [
        pa.field("schema_version", pa.int16(), nullable=False),
        pa.field("run", pa.string(), nullable=False),
        pa.field("episode_id", pa.string(), nullable=False),
        pa.field("method", pa.string(), nullable=False),
        pa.field("condition", pa.string()),  # v2
        pa.field("budget", pa.string(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("db_id", pa.string(), nullable=False),
        pa.field("turn", pa.int32(), nullable=False),
        pa.field("action", pa.string(), nullable=False),  # one of ACTIONS
        pa.field("valid", pa.bool_(), nullable=False),
        pa.field("sql", pa.string()),
        pa.field("status", pa.string()),  # shield status for executions: ok / truncated / rejected / error
        pa.field("warning", pa.bool_(), nullable=False),  # the policy-visible estimate warned about this SQL
        pa.field("est_rows_p50", pa.float64()),
        pa.field("est_rows_p95", pa.float64()),
        pa.field("est_result_tokens_p50", pa.float64()),
        pa.field("est_result_tokens_p95", pa.float64()),
        pa.field("est_vm_steps_p50", pa.float64()),
        pa.field("est_vm_steps_p95", pa.float64()),
        pa.field("actual_rows", pa.int64()),  # rows the query produced (before visible caps), when executed
        pa.field("actual_result_tokens", pa.int64()),  # result tokens the full result would have cost
        pa.field("actual_vm_steps", pa.int64()),
        pa.field("ctx_before", pa.int64(), nullable=False),
        pa.field("ctx_after", pa.int64(), nullable=False),
        pa.field("queries_before", pa.int64(), nullable=False),
        pa.field("queries_after", pa.int64(), nullable=False),
        pa.field("result_tokens_before", pa.int64(), nullable=False),
        pa.field("result_tokens_after", pa.int64(), nullable=False),
        pa.field("vm_steps_before", pa.int64(), nullable=False),
        pa.field("vm_steps_after", pa.int64(), nullable=False),
        pa.field("prompt_tokens", pa.int64(), nullable=False),
        pa.field("completion_tokens", pa.int64(), nullable=False),
        pa.field("db_wait_s", pa.float64()),  # seconds the turn waited for another program's lock on the database
        # v3, served episodes (bapsql.serve): the turn's wall time split into the engine call, the estimator /
        # shield calls, and the rest of the harness; null where a runner does not measure them
        pa.field("model_s", pa.float64()),
        pa.field("db_s", pa.float64()),
        pa.field("harness_s", pa.float64()),
        # v4: the policy's completion as the env received it and the observation the env returned, each capped at
        # bapsql.logs.text.TEXT_CAP_CHARS characters; null when the run's log_text setting did not keep them
        pa.field("completion", pa.string()),
        pa.field("observation", pa.string()),
    ]
)

PARTITION_COLUMNS: tuple[str, ...] = ("method", "budget")
