"""``bapsql model``: build the tiny local policy model and sample from a model folder with any engine.

- ``bapsql model make-tiny --out DIR [--seed 0] [--pretrain-steps N] [--force]`` writes the ~3M-parameter
  Qwen2-architecture model (`bapsql.rollout.tiny_model.make_tiny_model`) and prints what it wrote.
- ``bapsql model sample --model DIR --prompt TEXT [--engine hf|vllm] [--max-tokens N] [--temperature T]
  [--seed S] [--chat]`` encodes the prompt with the folder's tokenizer (``--chat``: as one user turn through the
  folder's chat template), generates once, and prints the completion, its token ids and mean logprob.
"""

from __future__ import annotations

from pathlib import Path

import click


@click.group("model")
def model() -> None:
    """Build the tiny local model and sample from model folders."""


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
        from bapsql.rollout.tiny_model import make_tiny_model
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
@click.option("--model", "model_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="model folder (e.g. one written by make-tiny)")
@click.option("--prompt", required=True, help="prompt text")
@click.option("--engine", "kind", type=click.Choice(["hf", "vllm"]), default="hf", show_default=True,
              help="engine to generate with")
@click.option("--max-tokens", default=32, show_default=True, type=click.IntRange(min=1))
@click.option("--temperature", default=0.0, show_default=True, type=click.FloatRange(min=0.0),
              help="0 = greedy")
@click.option("--seed", default=None, type=int, help="request seed (sampling only)")
@click.option("--chat", is_flag=True, help="wrap the prompt as one user turn with the folder's chat template")
def sample(model_dir: Path, prompt: str, kind: str, max_tokens: int, temperature: float, seed: int | None,
           chat: bool) -> None:
    """Generate one completion from MODEL with the hf or vllm engine and print it."""
    if not (model_dir / "config.json").is_file():
        raise click.UsageError(f"--model: {model_dir} is not a model folder (no config.json); "
                               "build one with `bapsql model make-tiny --out DIR`")
    from bapsql.errors import BapsqlError
    from bapsql.rollout.engines.base import EngineConfig, SamplingParams
    from bapsql.rollout.engines.codec import ModelCodec
    from bapsql.rollout.engines.factory import make_engine

    try:
        codec = ModelCodec.from_dir(model_dir)
        if chat:
            from bapsql.policies.chat import ChatTemplate

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
