"""SFT data from the nine programmatic workflows (paper "Training": 8,192 turn-level pairs; DESIGN §5).

Contract of `export_sft(benchmark_dir, split, n, out, ...)`:

- Every episode runs under one condition (`bapsql.env.conditions`, default ``full``); the prompts show only its
  tools, so an action-matched SFT set (``no_planning``) comes from the same workflows.
- Episodes are drawn in a seeded order: each pass shuffles the split's tasks; episode i runs workflow
  ``workflows[i mod 9]`` (a balanced mix) at a budget drawn uniformly from XS / S / M / L (the paper trains one
  policy across the four levels and states no other mix), with seed i. Passes repeat until ``n`` pairs are kept or
  a pass adds nothing new.
- ``branch_tries`` k ≥ 1: a workflow with a budget-aware branch (`ScriptedPolicy.has_branch`: estimate_rewrite,
  justified_abstention, recover_after_rejection) keeps its slot in the rotation for up to k episodes (next task,
  new budget draw) until one worth keeping (the rules below) takes the branch (`took_branch`); the episodes before
  it are dropped, and the k-th is judged by those rules whatever it did. Without it (0) most of their episodes play
  the plain path: on a task and budget where nothing warns, estimate_rewrite estimates and executes. The other
  workflows are unaffected.
- Only episodes worth imitating are kept: budgeted successes, and justified abstentions (the env's
  ``justified_abstention_wrong``, or the task's ``min_level:<L>`` tag says the gold query needs a larger budget).
- Every turn of a kept episode is one pair: ``prompt`` = the token stream a model policy sees at that turn, built
  exactly as rollouts build it (`bapsql.policies.chat.TokenTrajectory`: the first prompt rendered once with the
  generation prompt, then each completion as tokens and each observation as the template's continuation; a fresh
  segment after ``context_rewritten``), with the chat-template options ``template_kwargs`` (e.g.
  ``enable_thinking: false``) that rollouts and the sync probe use too; ``completion`` = the workflow's tool call
  + the template's end-of-turn token (`bapsql.models.framing.ChatFraming.end_of_turn_text`: ``<|im_end|>`` for
  ChatML, ``<|eot_id|>`` for Llama 3), as a rollout samples it. For prefix-stable templates this equals rendering
  the live messages afresh; for templates that re-render history differently (Qwen3's think blocks) only the stream
  is what the policy really sees.
  Prompts are rendered exactly as the env charges context — the system message carries the tool list, so the
  template's JSON ``tools`` block is NOT added by default (it would add ~900 tokens the env never charges;
  ``tool_schemas=True`` adds it). Pairs longer than ``max_length`` tokens are dropped (counted).
- Pairs are deduplicated by the hash of (prompt, completion); the first ``n`` unique pairs are written as Parquet
  (atomically: temp file + rename) with columns ``prompt, completion, prompt_ids, completion_ids, input_ids,
  loss_mask, workflow, budget, task_id, db_id, turn, seed``. ``input_ids = prompt_ids + completion_ids`` and
  ``loss_mask`` is 1 exactly on the completion tokens.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from bapsql.budgets import LEVELS, load_ladder
from bapsql.errors import ConfigError, DataError
from bapsql.policies.registry import WORKFLOW_NAMES, make_policy

KEEP_FAILURES: tuple[str, ...] = ("", "justified_abstention_wrong")  # success, or a justified abstention


def abstention_justified(tags: tuple[str, ...], level: str) -> bool:
    """Whether the task's generator tags say even the gold query does not fit ``level``: ``min_level:<L>`` names
    the tightest ladder level it fits (``none``: no level), ``unanswerable_<level>`` marks the level directly."""
    if f"unanswerable_{level.lower()}" in tags:
        return True
    for tag in tags:
        if tag.startswith("min_level:") and level in LEVELS:
            need = tag.split(":", 1)[1]
            return need == "none" or (need in LEVELS and LEVELS.index(need) > LEVELS.index(level))
    return False


def worth_imitating(summary, tags: tuple[str, ...], level: str) -> bool:
    """Keep budgeted successes and justified abstentions (see `abstention_justified`)."""
    if summary.failure in KEEP_FAILURES:
        return True
    return bool(summary.abstained) and abstention_justified(tags, level)


@dataclass(frozen=True)
class SFTExport:
    """What an export wrote."""

    path: Path
    pairs: int
    episodes: int  # episodes played
    kept_episodes: int
    duplicates: int  # pairs dropped as duplicates of earlier ones
    too_long: int  # pairs dropped for exceeding max_length
    per_workflow: dict[str, int] = field(default_factory=dict)
    per_budget: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    branched: dict[str, int] = field(default_factory=dict)  # kept episodes that took their workflow's branch
    kept_per_budget: dict[str, int] = field(default_factory=dict)  # kept episodes per budget level
    # kept episodes per level whose first imitated action is an estimate (the data's "estimate first" condition)
    estimate_first: dict[str, int] = field(default_factory=dict)

    def estimate_first_line(self) -> str:
        return estimate_first_line(self.kept_per_budget, self.estimate_first)


def estimate_first_line(kept_per_budget: Mapping[str, int], estimate_first: Mapping[str, int]) -> str:
    """``XS 39/55, S 37/62, ...``: kept episodes that start with an estimate, per level (in ``kept_per_budget``'s
    order)."""
    return ", ".join(f"{b} {estimate_first.get(b, 0)}/{k}" for b, k in kept_per_budget.items())


def pair_key(prompt: str, completion: str) -> str:
    """The dedup key of a pair."""
    h = hashlib.blake2b(digest_size=16)
    h.update(prompt.encode("utf-8"))
    h.update(b"\x00")
    h.update(completion.encode("utf-8"))
    return h.hexdigest()


def _episode_items(template: Any, turns: list[tuple[list[dict], str, bool]], tools: Any, template_kwargs: dict,
                   per_episode: bool, staged: frozenset[int] = frozenset(),
                   ) -> list[tuple[int, str, str, list[int], list[int]]]:
    """The rows of one kept episode as ``(turn, prompt, completion, input_ids, loss_mask)``: one per turn, or with
    ``per_episode`` one per token-stream segment (every completion in the loss). The ids are the token stream the
    rollouts build (`TokenTrajectory`), so SFT prompts are what the policy will see token for token. ``staged``:
    turns (1-based) the workflow played only to set up a situation: no row of their own, and out of the loss."""
    from bapsql.policies.chat import TokenTrajectory

    end_of_turn = template.framing(**template_kwargs).end_of_turn_text
    stream, seen_msgs, items = None, 0, []
    for turn, (msgs, text, rewritten) in enumerate(turns, start=1):
        if stream is None:
            stream = TokenTrajectory(template, msgs, tools=tools, **template_kwargs)
        else:  # what the agent appends: the messages after the assistant's, or a new segment
            stream.add_observation(msgs[seen_msgs + 1:], context_rewritten=rewritten,
                                   conversation=msgs if rewritten else None)
        seen_msgs = len(msgs)
        prompt_ids = stream.prompt_ids
        completion_ids = template.encode(text + end_of_turn)
        stream.add_completion(completion_ids)
        if not per_episode and turn not in staged:
            items.append((turn, template.decode(prompt_ids), text + end_of_turn, prompt_ids + completion_ids,
                          [0] * len(prompt_ids) + [1] * len(completion_ids)))
    if per_episode and stream is not None:
        number = 0
        for seg in stream.segments:
            ids, mask = list(seg.input_ids), list(seg.loss_mask)
            for t in seg.turns:
                number += 1
                if number in staged:
                    start = len(t.prompt_ids)
                    mask[start:start + len(t.completion_ids)] = [0] * len(t.completion_ids)
            if 1 not in mask:
                continue
            cut = mask.index(1)
            items.append((len(seg.turns), template.decode(ids[:cut]), template.decode(ids[cut:]), ids, mask))
    return items


def _write_parquet(rows: list[dict], out: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("prompt", pa.string()), ("completion", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())), ("completion_ids", pa.list_(pa.int32())),
        ("input_ids", pa.list_(pa.int32())), ("loss_mask", pa.list_(pa.int8())),
        ("workflow", pa.string()), ("budget", pa.string()), ("task_id", pa.string()), ("db_id", pa.string()),
        ("turn", pa.int32()), ("seed", pa.int64()),
    ])
    table = pa.Table.from_pylist(rows, schema=schema)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    pq.write_table(table, tmp)
    os.replace(tmp, out)


def export_sft(benchmark_dir: str | Path, split: str, n: int, out: str | Path, *, seed: int = 0,
               workflows: tuple[str, ...] = WORKFLOW_NAMES, budgets: tuple[str, ...] = LEVELS,
               condition: Any = "full", tool_schemas: bool = False, max_length: int = 8192,
               tokenizer_dir: str | Path | None = None, template_kwargs: dict[str, Any] | None = None,
               console: Any = None, env_options: Any = None, per_episode: bool = False, tasks: list | None = None,
               only_successes: bool = False, slips: Any = None, branch_tries: int = 0) -> SFTExport:
    """Collect ``n`` deduplicated turn-level pairs from the workflows on ``split`` (see the module docstring), every
    episode under ``condition`` (a preset name or `Condition`: e.g. ``no_planning`` for the action-matched suite).

    ``env_options``: the base `EnvOptions` (e.g. ``prompt_style``; the condition applies on top). ``per_episode``:
    one row per kept episode's token stream (per segment when evidence management rewrote the context) instead of per
    turn, every completion in the loss (``turn`` = its number of turns; ``n`` then counts rows). ``tasks``: play
    these instead of the split's. ``only_successes``: keep budgeted successes only (no justified abstentions).
    ``slips``: a `bapsql.policies.slips.SlipBank`; ``workflow.recover_from_error`` episodes then play its tasks with
    its slips (a policy's own failed first queries) instead of ``tasks`` with synthetic ones (the other workflows'
    episodes are unchanged, so the workflows' shares stay as listed). ``branch_tries``: see the module docstring."""
    from bapsql.env.actions import TOOL_SCHEMAS
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.env.handles import DatabaseHandles
    from bapsql.env.records import EnvOptions
    from bapsql.models.chat_template import ChatTemplate
    from bapsql.data.tasks import load_tasks, resolve_benchmark
    from bapsql.rollout.runner import play_episode
    from bapsql.tokens import DEFAULT_TOKENIZER_DIR, HFTokenCounter

    if n < 1:
        raise ConfigError(f"n must be at least 1, got {n}")
    if branch_tries < 0:
        raise ConfigError(f"branch_tries must be >= 0 (0: off), got {branch_tries}")
    t_start = time.perf_counter()
    announce = (lambda msg: console.print(f"[yellow]{msg}[/yellow]")) if console is not None else None
    root = resolve_benchmark(benchmark_dir, announce=announce)
    tasks = load_tasks(root, split) if tasks is None else list(tasks)
    base_options = env_options if env_options is not None else EnvOptions()
    if not tasks:
        raise DataError(f"split {split!r} of {root} has no tasks")
    tok_dir = Path(tokenizer_dir) if tokenizer_dir is not None else DEFAULT_TOKENIZER_DIR
    template = ChatTemplate.from_dir(tok_dir)
    counter = HFTokenCounter(tok_dir, template_kwargs=template_kwargs)
    ladder = load_ladder()
    policies = [make_policy(w) for w in workflows]
    if slips is not None:
        from bapsql.policies.workflows import RecoverFromError

        policies = [RecoverFromError(slips.slips) if isinstance(p, RecoverFromError) else p for p in policies]
        if not any(isinstance(p, RecoverFromError) for p in policies):
            raise ConfigError("a slip bank was given but the workflows do not include workflow.recover_from_error, "
                              "the only workflow that plays slips")
    levels = [ladder[b] for b in budgets]
    rng = np.random.default_rng(seed)
    rows: list[dict] = []
    seen: set[str] = set()
    played = kept = dups = too_long = 0
    # the rotation's position (== played unless branch_tries holds a slot), the slot's tries, episodes since a new pair
    slot = tries = since_new = 0
    per_workflow: dict[str, int] = {}
    branched: dict[str, int] = {}
    per_budget: dict[str, int] = {}
    kept_per_budget: dict[str, int] = {}
    estimate_first: dict[str, int] = {}

    from bapsql.progress import Progress

    progress = Progress(console, "SFT pairs", n).start()
    try:
        with DatabaseHandles(counter) as handles:
            env = BudgetedSQLEnv(token_counter=counter, handles=handles, options=base_options.under(condition))
            tools = [s for s in TOOL_SCHEMAS if env.options.condition.offers(s["function"]["name"])]
            while len(rows) < n:
                added_this_pass = 0
                for ti in rng.permutation(len(tasks)):
                    if len(rows) >= n:
                        break
                    task, policy = tasks[int(ti)], policies[slot % len(policies)]
                    if slips is not None and getattr(policy, "slips", None):
                        task = slips.tasks[int(rng.integers(len(slips)))]
                    budget = levels[int(rng.integers(len(levels)))]
                    turns: list[tuple[list[dict], str, bool]] = []
                    summary = play_episode(env, policy, task, budget, played, on_turn=lambda msgs, text, info: (
                        turns.append((msgs, text, bool(info.get("context_rewritten"))))))
                    played += 1
                    since_new += 1
                    took = policy.took_branch(summary)
                    good = worth_imitating(summary, task.tags, budget.level) and not (
                        only_successes and summary.failure != "")
                    tries += 1
                    if branch_tries > 0 and policy.has_branch and not (took and good) and tries < branch_tries:
                        continue  # the slot waits for an episode worth imitating that takes the branch
                    slot, tries = slot + 1, 0
                    if not good:
                        continue
                    kept += 1
                    if took:
                        branched[policy.name] = branched.get(policy.name, 0) + 1
                    staged = getattr(policy, "staged_turns", frozenset())
                    first = next((r.action for i, r in enumerate(env.turn_records, 1) if i not in staged), None)
                    kept_per_budget[budget.level] = kept_per_budget.get(budget.level, 0) + 1
                    estimate_first[budget.level] = estimate_first.get(budget.level, 0) + (first == "estimate_query")
                    for turn, prompt, completion, input_ids, loss_mask in _episode_items(
                            template, turns, tools if tool_schemas else None, template_kwargs or {}, per_episode,
                            staged):
                        key = pair_key(prompt, completion)
                        if key in seen:
                            dups += 1
                            continue
                        if len(input_ids) > max_length:
                            too_long += 1
                            continue
                        seen.add(key)
                        added_this_pass += 1
                        since_new = 0
                        cut = loss_mask.index(1) if 1 in loss_mask else len(loss_mask)
                        rows.append({
                            "prompt": prompt, "completion": completion, "prompt_ids": input_ids[:cut],
                            "completion_ids": input_ids[cut:], "input_ids": input_ids, "loss_mask": loss_mask,
                            "workflow": policy.name, "budget": budget.level, "task_id": task.task_id,
                            "db_id": task.db_id, "turn": turn, "seed": played - 1,
                        })
                        per_workflow[policy.name] = per_workflow.get(policy.name, 0) + 1
                        per_budget[budget.level] = per_budget.get(budget.level, 0) + 1
                        progress.advance()
                        if len(rows) >= n:
                            break
                # nothing new in a whole pass: stop (a slot held mid-pass gets up to branch_tries more per workflow)
                if added_this_pass == 0 and (tries == 0 or since_new >= len(tasks) + branch_tries * len(policies)):
                    break
    finally:
        progress.stop()
    out = Path(out)
    _write_parquet(rows, out)
    order = {b.level: i for i, b in enumerate(levels)}
    kept_per_budget = dict(sorted(kept_per_budget.items(), key=lambda kv: order[kv[0]]))
    return SFTExport(out, len(rows), played, kept, dups, too_long, per_workflow, per_budget,
                     time.perf_counter() - t_start, branched, kept_per_budget, estimate_first)


def split_pairs(total: int, parts: int) -> list[int]:
    """``total`` pairs over ``parts`` conditions, as evenly as integers allow (the first get the remainder)."""
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def export_sft_shares(conditions: tuple[str, ...], benchmark_dir: str | Path, split: str, n: int, out: str | Path,
                      *, console: Any = None, **kw: Any) -> list[SFTExport]:
    """`export_sft` under several conditions in equal shares (`split_pairs`): each share into
    ``<out stem>-<condition>.parquet``, then all of them into ``out`` (atomically) with a ``condition`` column, so no
    condition's prompt format is seen more than another's. One condition: `export_sft` into ``out`` (no column)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not conditions:
        raise ConfigError("conditions: list at least one condition to export under")
    out = Path(out)
    if len(conditions) == 1:
        return [export_sft(benchmark_dir, split, n, out, condition=conditions[0], console=console, **kw)]
    if n < len(conditions):
        raise ConfigError(f"{n} pairs are fewer than one per condition ({len(conditions)})")
    exports, parts = [], []
    for cond, k in zip(conditions, split_pairs(n, len(conditions))):
        part = out.with_name(f"{out.stem}-{cond}.parquet")
        if console is not None:
            console.print(f"[cyan]exporting {k} SFT pairs under {cond} into {part} ...[/cyan]")
        exports.append(export_sft(benchmark_dir, split, k, part, condition=cond, console=console, **kw))
        table = pq.read_table(part)
        parts.append(table.append_column("condition", pa.array([cond] * table.num_rows, pa.string())))
    tmp = out.with_name(f".{out.name}.tmp")
    pq.write_table(pa.concat_tables(parts), tmp)
    os.replace(tmp, out)  # whole or absent: a rerun never trains on a partial file
    return exports
