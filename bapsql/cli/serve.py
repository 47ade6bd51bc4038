"""``bapsql serve``: budgeted question answering over your own SQLite files, as an HTTP service with a web page."""

from __future__ import annotations

from typing import Any

import click

_LOOPBACK = ("127.0.0.1", "localhost", "::1")


@click.command("serve")
@click.option("--db", "dbs", multiple=True, required=True, type=click.Path(dir_okay=False),
              help="An SQLite file to answer about (repeatable); requests name it by its stem (shop.db -> shop).")
@click.option("--engine", default=None, metavar="YAML|openai_chat:URL|vllm|hf",
              help="Engine YAML; openai_chat:URL for an OpenAI-compatible chat API (URL ends in /v1); or vllm / hf "
                   "to run --model in this process (default with --model alone: vllm when installed, else hf).")
@click.option("--model", default=None,
              help="A model to run locally: a registry name (bapsql model list, e.g. smollm2-135m-instruct; fetched "
                   "on first use) or a model folder; with openai_chat:URL, the served model's name.")
@click.option("--condition", default="full", show_default=True, help="Condition every episode runs under.")
@click.option("--budget", "default_budget", default="S", show_default=True,
              help="Budget level of requests that name none.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind (loopback by default).")
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
@click.option("--api-key-env", default=None, metavar="VAR",
              help="Require 'Authorization: Bearer $VAR' on every /v1 request.")
@click.option("--log-dir", default="bapsql-serve-logs", show_default=True, type=click.Path(file_okay=False),
              help="Run folder of the Parquet logs (one episode per request; `bapsql analyze` reads it).")
@click.option("--concurrency", default=8, show_default=True, type=click.IntRange(min=1),
              help="Episodes played at once (a local engine decodes all their turns in one batch).")
@click.option("--max-queue", default=64, show_default=True, type=click.IntRange(min=0),
              help="Requests admitted to wait for an episode; more are refused at once with 429 and Retry-After.")
@click.option("--request-timeout", default=300.0, show_default=True, type=click.FloatRange(min=0, min_open=True),
              help="Seconds a request may take from its arrival (waiting included); past it the answer is 504 and "
                   "its turns so far are logged as timed_out.")
@click.option("--restart-engine/--no-restart-engine", default=True, show_default=True,
              help="Rebuild a local engine that died (meanwhile /healthz and requests answer 503 with the reason).")
@click.option("--max-tokens", default=512, show_default=True, type=click.IntRange(min=1),
              help="Completion tokens per turn (the context budget may allow fewer).")
@click.option("--max-body-bytes", default=16_384, show_default=True, type=click.IntRange(min=256))
@click.option("--calibration", default=None, type=click.Path(dir_okay=False, exists=True),
              help="Estimator calibration JSON (default: the packaged one).")
@click.option("--chat-template-kwargs", default=None, metavar="JSON",
              help="Chat-template options, e.g. '{\"enable_thinking\": false}' for Qwen3-class models: prompts are "
                   "rendered with them and openai_chat sends them to the server (replaces the engine YAML's).")
@click.option("--allow-remote-without-key", is_flag=True,
              help="Allow binding a non-loopback --host without --api-key-env (not recommended).")
def serve_cmd(dbs: tuple[str, ...], engine: str | None, model: str | None, condition: str, default_budget: str,
              host: str, port: int, api_key_env: str | None, log_dir: str, concurrency: int, max_queue: int,
              request_timeout: float, restart_engine: bool, max_tokens: int, max_body_bytes: int,
              calibration: str | None, chat_template_kwargs: str | None, allow_remote_without_key: bool) -> None:
    """Serve POST /v1/ask {"db": NAME, "question": TEXT, "budget": "XS"|"S"|"M"|"L"}: every request is one budgeted
    episode (estimator, shield, ledger, evidence) of the model behind --engine, answered as JSON and logged to
    LOG_DIR. The web page is at http://HOST:PORT/ and the API docs at /docs.

    \b
    Examples:
      bapsql serve --db shop.db --model smollm2-135m-instruct
      bapsql serve --db shop.db --engine openai_chat:http://127.0.0.1:8000/v1 --model Qwen/Qwen3-4B --port 8080
    """
    import dataclasses
    import os

    import uvicorn
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress

    from bapsql.db.calibration import load_calibration
    from bapsql.env.conditions import condition as lookup_condition
    from bapsql.errors import BapsqlError
    from bapsql.rollout.engines.factory import engine_config_from_spec, make_engine
    from bapsql.serve.app import create_app
    from bapsql.serve.registry import DatabaseRegistry
    from bapsql.serve.session import Asker, ServeOptions
    from bapsql.tokens import load_token_counter

    console = Console(stderr=True)
    api_key = None
    if api_key_env:
        api_key = os.environ.get(api_key_env)
        if not api_key:
            raise click.UsageError(f"--api-key-env {api_key_env}: the variable is not set (or empty); export it first")
    if host not in _LOOPBACK and api_key is None and not allow_remote_without_key:
        raise click.UsageError(f"--host {host} exposes the service beyond this machine; add --api-key-env VAR "
                               "(or --allow-remote-without-key if you really mean it)")
    try:
        lookup_condition(condition)
        if engine is None and model is None:
            raise click.UsageError("pass --model NAME (a registry name or model folder, run locally) and/or --engine "
                                   "(an engine YAML, openai_chat:URL, vllm or hf)")
        if engine is None or engine in LOCAL_KINDS:
            cfg = _local_engine_config(engine, model, console)
        else:
            cfg = engine_config_from_spec(engine, model=model)
        if chat_template_kwargs is not None:
            cfg = dataclasses.replace(cfg, chat_template_kwargs=_json_object(chat_template_kwargs))
        cal = load_calibration(calibration) if calibration else None
        kwargs = dict(cfg.chat_template_kwargs)
        counter = load_token_counter(str(cfg.tokenizer_dir), **kwargs) if cfg.tokenizer_dir else load_token_counter()
        with Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), console=console,
                      transient=True) as bar:
            job = bar.add_task("catalogs", total=None)

            def progress(db: str, done: int, total: int, table: str) -> None:
                bar.update(job, description=f"catalog of {db}: {table}", completed=done, total=total)

            registry = DatabaseRegistry.open(dbs, counter, calibration=cal, progress=progress)
        eng = make_engine(cfg)
    except BapsqlError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        options = ServeOptions(condition=condition, default_budget=default_budget, concurrency=concurrency,
                               max_tokens=max_tokens, log_dir=log_dir, max_queue=max_queue,
                               request_timeout_s=request_timeout)
        asker = Asker(eng, cfg, registry, options, calibration=cal,
                      restart=(lambda: make_engine(cfg)) if restart_engine else None)
    except BapsqlError as exc:
        eng.close()
        raise click.ClickException(str(exc)) from exc
    app = create_app(asker, api_key=api_key, max_body_bytes=max_body_bytes,
                     engine_label=f"{cfg.kind}:{cfg.base_url or cfg.model}")
    names = ", ".join(registry.names)
    console.print(f"[green]serving {names} with {cfg.kind} model {cfg.model} under {condition} at "
                  f"http://{host}:{port}/ (logs: {log_dir})[/green]")
    try:
        uvicorn.run(app, host=host, port=port, log_level="warning")
    finally:
        asker.close()
        eng.close()  # idempotent: a local engine's scheduler closed it already
    console.print(f"{asker.logged} episodes logged to {log_dir}; analyse with: bapsql analyze {log_dir}")


LOCAL_KINDS = ("vllm", "hf")
MAX_LOCAL_LEN = 16_384  # context of a local engine: the model's max positions, at most this


def _local_engine_config(kind: str | None, model: str | None, console: Any) -> Any:
    """The `EngineConfig` that runs ``model`` (a registry name, fetched on first use, or a model folder) in this
    process with ``kind`` (vllm | hf; default vllm when installed, else hf)."""
    import importlib.util
    import json
    from pathlib import Path

    from bapsql.models.resolve import resolve_model
    from bapsql.rollout.engines.base import EngineConfig

    if not model:
        raise click.UsageError(f"--engine {kind}: name the model to run with --model (a registry name or a folder)")
    folder = Path(resolve_model(model, announce=console.print))
    if not (folder / "config.json").is_file():
        raise click.UsageError(f"--model {model}: not a registry name (bapsql model list) nor a model folder with a "
                               "config.json")
    if kind is None:
        kind = "vllm" if importlib.util.find_spec("vllm") is not None else "hf"
    positions = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("max_position_embeddings")
    max_len = min(MAX_LOCAL_LEN, positions) if isinstance(positions, int) and positions > 0 else 4096
    return EngineConfig(kind=kind, model=str(folder), max_model_len=max_len)


def _json_object(text: str) -> dict:
    """``--chat-template-kwargs``: a JSON object, else a usage error saying what to pass."""
    import json

    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise click.UsageError(f"--chat-template-kwargs: not JSON ({exc}); pass an object, e.g. "
                               "'{\"enable_thinking\": false}'") from exc
    if not isinstance(value, dict):
        raise click.UsageError(f"--chat-template-kwargs: pass a JSON object, got {type(value).__name__}")
    return value
