"""``bapsql exec`` and ``bapsql episode``: drive the budgeted environment from the command line.

Contract (scripts rely on it):

- ``bapsql exec --db F --sql Q --budget LEVEL --json`` prints ONE JSON object with ``status`` (ok | truncated |
  rejected | error), ``rows`` (the shown rows), ``columns``, ``message``, ``ledger`` (spent ``queries``,
  ``result_tokens``, ``vm_steps``, ``turns``, ``context_tokens``, plus ``remaining``). It is one execute_query turn
  of a fresh episode at that budget, through the real environment. Exit 0 for ok / truncated / rejected, 2 for an
  SQL error or an unusable database, never a traceback. A database another program keeps write-locked past
  ``--busy-timeout`` seconds is ``rejected`` with ``rejection`` = ``busy`` (also when it was locked while opening).
- ``bapsql episode --db F --question TEXT --budget XS [--actions FILE] [--gold-sql SQL] [--json]`` plays actions
  (one per line: a one-line tool call, or a JSON object ``{"name": .., "arguments": ..}``; without ``--actions``
  they are read from stdin until the episode ends or EOF), printing every observation, then the ledger and summary.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click


class _Exit2(click.ClickException):
    """A clear one-line error with exit status 2."""

    exit_code = 2


def _counter(spec: str):
    from bapsql.errors import ConfigError
    from bapsql.tokens import load_token_counter

    try:
        if spec == "default":
            from bapsql.db.handle import default_counter

            return default_counter()
        return load_token_counter(spec)
    except ConfigError as exc:
        raise click.UsageError(f"--tokenizer: {exc}") from None


def _budget(level: str):
    from bapsql.budgets import load_ladder
    from bapsql.errors import ConfigError

    try:
        return load_ladder()[level]
    except ConfigError as exc:
        raise click.UsageError(f"--budget: {exc}") from None


def _jsonable(v):
    if isinstance(v, (bytes, bytearray, memoryview)):
        return f"<blob {len(v)} bytes>"
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return v


LARGE_FILE = 64 << 20  # bytes: building the catalog of a larger database shows a progress bar


def _catalog_progress(db: Path):
    """A transient per-table progress bar on stderr for (re)building the catalog of a large database, else None.
    Returns (callback, stop)."""
    if db.stat().st_size < LARGE_FILE:
        return None, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("catalog {task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), transient=True)
    task = bar.add_task(db.name, total=None)
    bar.start()

    def progress(done: int, total: int, table: str) -> None:
        bar.update(task, completed=done, total=total, description=f"{db.name} {table}")

    return progress, bar.stop


def _start(db: Path, question: str, level: str, tokenizer: str, gold_sql: str = "", evidence: str = "",
           busy_timeout: float = 3.0, calibration: Path | None = None, condition: str = "full"):
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.env.handles import DatabaseHandles
    from bapsql.env.records import EnvOptions
    from bapsql.errors import DatabaseBusy, DatabaseError
    from bapsql.types import Task

    if not db.is_file():
        raise _Exit2(f"database file not found: {db}; pass an existing SQLite file with --db")
    budget = _budget(level)
    counter = _counter(tokenizer)
    from bapsql.db.calibration import load_calibration
    from bapsql.errors import ConfigError

    try:
        cal = load_calibration(calibration) if calibration is not None else None
        options = EnvOptions(busy_timeout_s=busy_timeout).under(condition)
    except ConfigError as exc:
        raise _Exit2(str(exc)) from None
    progress, stop = _catalog_progress(db)
    handles = DatabaseHandles(counter, progress=progress, busy_timeout_s=busy_timeout, calibration=cal)
    env = BudgetedSQLEnv(token_counter=counter, handles=handles, options=options)
    task = Task(task_id="cli", db_id=db.stem, db_path=str(db), question=question, gold_sql=gold_sql,
                evidence=evidence)
    try:
        observation, info = env.reset(task, budget)
    except DatabaseError as exc:
        raise _Exit2(str(exc)) from None
    except DatabaseBusy as exc:
        raise _Busy(str(exc), budget) from None
    finally:
        stop()
    return env, observation, info


class _Busy(Exception):
    """The database stayed locked by a writer while it was being opened (before any turn)."""

    def __init__(self, message: str, budget) -> None:
        super().__init__(message)
        self.budget = budget


_TOKENIZER = click.option("--tokenizer", default="default", show_default=True,
                          help="token counter: 'default' (packaged tokenizer), 'regex', or a tokenizer.json path")
_CALIBRATION = click.option("--calibration", type=click.Path(dir_okay=False, path_type=Path), default=None,
                            help="estimator calibration JSON (`bapsql data calibrate --out`); default: the packaged one")
_CONDITION = click.option("--condition", default="full", show_default=True,
                          help="the condition the turn runs under (see `bapsql conditions`)")
_BUDGET = click.option("--budget", "level", default="XS", show_default=True, help="budget level: XS, S, M or L")
_BUSY = click.option("--busy-timeout", default=3.0, show_default=True, type=click.FloatRange(min=0),
                     help="seconds a query waits for another program's write lock before the turn is rejected as "
                          "'database busy'")


@click.command("exec")
@click.option("--db", type=click.Path(path_type=Path), required=True, help="SQLite database file (opened read-only)")
@click.option("--sql", required=True, help="one read-only SELECT statement")
@_BUDGET
@click.option("--json", "as_json", is_flag=True, help="print one JSON object")
@_TOKENIZER
@_BUSY
@_CALIBRATION
@_CONDITION
def exec_cmd(db: Path, sql: str, level: str, as_json: bool, tokenizer: str, busy_timeout: float,
             calibration: Path | None, condition: str) -> None:
    """Run one query as one execute_query turn of a fresh episode at a budget (shield, caps and full accounting)."""
    from bapsql.env.actions import ExecuteQuery, render_action

    try:
        env, observation, _info = _start(db, "(ad-hoc query)", level, tokenizer, busy_timeout=busy_timeout,
                                         calibration=calibration, condition=condition)
    except _Busy as busy:  # locked while opening: the same 'busy' rejection an execute_query turn gets
        from bapsql.env.render import busy_observation

        text = busy_observation("execute_query", str(busy))
        spent = {ch: 0 for ch in busy.budget.as_dict()}
        out = {"status": "rejected", "columns": [], "rows": [], "rows_total": None, "truncated_by": None,
               "rejection": "busy", "message": str(busy), "evidence_ref": None,
               "ledger": {**spent, "remaining": busy.budget.as_dict()}, "observation": text}
        click.echo(json.dumps(out, ensure_ascii=False) if as_json else text)
        return
    if env.done:
        raise _Exit2(f"the episode could not start at budget {level}: {observation}")
    try:
        result = env.step(render_action(ExecuteQuery(sql)))
    finally:
        env.handles.close()  # ends the episode's read snapshot (the episode itself stays open after one turn)
    info = result.info
    shield = info["shield"] or {}
    block = env.evidence.get(info["evidence_ref"]) if info["evidence_ref"] else None
    status = info["status"] or "rejected"
    spent, remaining = info["ledger"]["spent"], info["ledger"]["remaining"]
    out = {
        "status": status,
        "columns": list(block.columns) if block else list(shield.get("columns", ())),
        "rows": _jsonable(list(block.rows)) if block else [],
        "rows_total": shield.get("rows_total"),
        "truncated_by": block.truncated_by if block else shield.get("truncated_by"),
        "rejection": shield.get("rejection") or ("no_queries" if status == "rejected" and not shield else None),
        "message": info["message"],
        "evidence_ref": info["evidence_ref"],
        "ledger": {**spent, "remaining": remaining},
        "observation": result.observation,
    }
    if as_json:
        click.echo(json.dumps(out, ensure_ascii=False))
    else:
        click.echo(result.observation)
    if status == "error":
        sys.exit(2)


def _action_text(line: str) -> str:
    """A line of an actions file → the completion text handed to the environment."""
    from bapsql.env.actions import InvalidAction, action_from_json, render_action

    stripped = line.strip()
    if stripped.startswith("{"):
        try:
            action = action_from_json(json.loads(stripped))
        except ValueError:
            return stripped  # not JSON after all: the environment explains the invalid action
        return stripped if isinstance(action, InvalidAction) else render_action(action)
    return stripped


@click.command("episode")
@click.option("--db", type=click.Path(path_type=Path), required=True, help="SQLite database file (opened read-only)")
@click.option("--question", required=True, help="the natural-language question")
@_BUDGET
@click.option("--actions", "actions_file", type=click.File("r"), default=None,
              help="file with one action per line (tool-call text or JSON {name, arguments}); default: stdin")
@click.option("--gold-sql", default="", help="gold SQL: when given, the answer is scored against its result")
@click.option("--evidence", "hint", default="", help="an evidence hint shown with the question")
@click.option("--json", "as_json", is_flag=True, help="print one JSON object (observations, turns, summary)")
@_TOKENIZER
@_BUSY
@_CALIBRATION
@_CONDITION
def episode_cmd(db: Path, question: str, level: str, actions_file, gold_sql: str, hint: str, as_json: bool,
                tokenizer: str, busy_timeout: float, calibration: Path | None, condition: str) -> None:
    """Play a scripted (or interactive) episode and print every observation, the final ledger and the summary."""
    import dataclasses

    try:
        env, observation, info = _start(db, question, level, tokenizer, gold_sql, hint, busy_timeout, calibration,
                                        condition)
    except _Busy as busy:
        raise _Exit2(str(busy)) from None
    source = actions_file if actions_file is not None else sys.stdin
    steps = [{"turn": 0, "action": "reset", "observation": observation}]
    if not as_json:
        click.echo(f"=== system ===\n{env.messages[0]['content']}\n=== observation ===\n{observation}")
    for line in source:
        if env.done:
            break
        if not line.strip():
            continue
        result = env.step(_action_text(line))
        steps.append({"turn": result.info["turn"], "action": result.info["action"], "valid": result.info["valid"],
                      "observation": result.observation, "reward": result.reward})
        if not as_json:
            click.echo(f"=== turn {result.info['turn']}: {result.info['action']} ===\n{result.observation}")
    summary = dataclasses.asdict(env.summary())
    env.handles.close()  # ends the read snapshot of an episode the actions left unfinished
    ledger = env.ledger.snapshot().to_dict()
    if as_json:
        out = {"steps": steps, "turns": [r.to_row() for r in env.turn_records], "ledger": ledger,
               "summary": summary, "done": env.done}
        click.echo(json.dumps(_jsonable(out), ensure_ascii=False))
        return
    click.echo("=== ledger (spent / budget) ===")
    for ch, spent in ledger["spent"].items():
        click.echo(f"{ch}: {spent} / {ledger['budget'][ch]}")
    click.echo("=== summary ===")
    if not env.done:
        click.echo("(the actions ran out before the episode ended)")
    for k, v in summary.items():
        click.echo(f"{k}: {v}")
