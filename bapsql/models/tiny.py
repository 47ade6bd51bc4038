"""The tiny policy model: a ~3M-parameter Qwen2-architecture causal LM built locally from a config (no download).

Contract of `make_tiny_model(out_dir, *, seed=0, spec=TinySpec(), pretrain_steps=0)`:

- builds `transformers.Qwen2ForCausalLM` from `TinySpec` (hidden 128, 4 layers, 4 heads, 2 KV heads, MLP 384 by
  default: 2.89M parameters, two thirds of them the 8,192-token embedding and output matrices) with the vocabulary
  of the packaged tokenizer (`bapsql.tokens.DEFAULT_TOKENIZER_DIR`), **untied** embeddings (so vLLM can reload base
  weights in place) and float32 weights;
- initialises it deterministically from ``seed`` (same arguments → identical ``model.safetensors``);
- optionally runs ``pretrain_steps`` steps of next-token training (AdamW) on the tokenizer's own corpus
  (`bapsql.models.tokenizer_corpus.corpus_lines`: SQL, questions, tool calls wrapped as Qwen chat turns ending in
  ``<|im_end|>``), so greedy outputs look like the domain rather than noise; 100 steps (8 windows of 64 tokens
  each) take ~16 s of CPU time on one thread;
- writes a folder that both transformers and vLLM load: ``config.json``, ``generation_config.json`` (eos =
  ``<|im_end|>`` and ``<|endoftext|>``, pad = ``<|endoftext|>``), ``model.safetensors`` and the tokenizer files copied
  from the packaged tokenizer (chat template included).

Requires torch and transformers (the ``engines`` extra); they are imported inside the functions.
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from bapsql.errors import ConfigError
from bapsql.rollout.engines.codec import quiet_transformers
from bapsql.tokens import DEFAULT_TOKENIZER_DIR

TOKENIZER_FILES: tuple[str, ...] = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@dataclass(frozen=True)
class TinySpec:
    """Architecture of the tiny model (Qwen2 layout). ``hidden_size`` must be divisible by ``num_heads`` and
    ``num_heads`` by ``num_kv_heads``; head size = hidden_size / num_heads (32 by default)."""

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 8192
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size",
                     "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ConfigError(f"tiny model: {name} must be positive, got {getattr(self, name)}")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ConfigError("tiny model: hidden_size must divide by num_heads and num_heads by num_kv_heads")


@dataclass(frozen=True)
class TinyModel:
    """What `make_tiny_model` wrote. ``losses`` holds the pretraining loss every 10 steps (empty without it)."""

    out_dir: Path
    num_parameters: int
    vocab_size: int
    seed: int
    pretrain_steps: int
    losses: tuple[float, ...]
    seconds: float
    files: tuple[str, ...]


def _special_ids(tokenizer_dir: Path) -> dict[str, int]:
    data = json.loads((tokenizer_dir / "tokenizer.json").read_text(encoding="utf-8"))
    ids = {t["content"]: t["id"] for t in data.get("added_tokens", [])}
    for needed in ("<|endoftext|>", "<|im_start|>", "<|im_end|>"):
        if needed not in ids:
            raise ConfigError(f"tokenizer at {tokenizer_dir} lacks the special token {needed}")
    return ids


def _pretrain_texts(n: int, seed: int) -> list[str]:
    """``n`` training documents: corpus lines, tool-call JSON wrapped as an assistant turn (so the model learns to
    close turns with ``<|im_end|>``), each document ended by ``<|endoftext|>``."""
    from bapsql.models.tokenizer_corpus import corpus_lines

    docs = []
    for line in corpus_lines(scale=max(n, 1) / 60_000, seed=seed):
        if line.startswith('{"name"'):
            docs.append(f"<|im_start|>assistant\n<tool_call>\n{line}\n</tool_call><|im_end|>\n")
        else:
            docs.append(line + "<|endoftext|>")
        if len(docs) >= n:
            break
    return docs


def _pretrain(model, tokenizer_dir: Path, steps: int, seed: int, *, seq_len: int = 64, batch: int = 8,
              lr: float = 3e-3) -> list[float]:
    """Next-token training on packed corpus windows ``[batch, seq_len]``; returns the loss every 10 steps."""
    import torch
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    need = steps * batch * seq_len
    stream: list[int] = []
    # ~30 tokens per document on average: enough documents that windows rarely repeat, capped to keep it quick.
    for enc in tok.encode_batch(_pretrain_texts(min(20_000, max(200, need // 30)), seed), add_special_tokens=False):
        stream.extend(enc.ids)
    if len(stream) <= seq_len:
        raise ConfigError("tiny model: the pretraining corpus is too small")
    data = torch.tensor(stream, dtype=torch.long)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.1, 1 - s / steps))
    model.train()
    losses = []
    for step in range(steps):
        starts = torch.randint(0, len(data) - seq_len, (batch,), generator=gen)
        x = torch.stack([data[s:s + seq_len] for s in starts.tolist()])
        out = model(input_ids=x, labels=x)  # the model shifts labels internally
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        if step % 10 == 0 or step == steps - 1:
            losses.append(round(float(out.loss.detach()), 4))
    model.eval()
    return losses


def make_tiny_model(out_dir: str | Path, *, seed: int = 0, spec: TinySpec = TinySpec(), pretrain_steps: int = 0,
                    tokenizer_dir: str | Path = DEFAULT_TOKENIZER_DIR) -> TinyModel:
    """Build, optionally pretrain, and save the tiny model into ``out_dir`` (created; existing files replaced)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if pretrain_steps < 0:
        raise ConfigError(f"tiny model: pretrain_steps must be >= 0, got {pretrain_steps}")
    t0 = time.perf_counter()
    tok_dir = Path(tokenizer_dir)
    if not (tok_dir / "tokenizer.json").is_file():
        raise ConfigError(f"tiny model: no tokenizer.json in {tok_dir}")
    ids = _special_ids(tok_dir)
    vocab_size = max(ids.values()) + 1
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=spec.rope_theta,
        tie_word_embeddings=False,
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"],
        hidden_act="silu",
        rms_norm_eps=1e-6,
        use_sliding_window=False,
        initializer_range=0.02,
        dtype="float32",
    )
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # one thread: several threads collapse under CPU contention
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM(config).to(torch.float32)
            losses = _pretrain(model, tok_dir, pretrain_steps, seed) if pretrain_steps else []
    finally:
        torch.set_num_threads(threads)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with quiet_transformers():
        model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=ids["<|endoftext|>"],
        eos_token_id=[ids["<|im_end|>"], ids["<|endoftext|>"]],
        pad_token_id=ids["<|endoftext|>"],
    ).save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (tok_dir / name).is_file():
            shutil.copyfile(tok_dir / name, out / name)
    files = tuple(sorted(p.name for p in out.iterdir() if p.is_file()))
    return TinyModel(out_dir=out, num_parameters=sum(p.numel() for p in model.parameters()), vocab_size=vocab_size,
                     seed=seed, pretrain_steps=pretrain_steps, losses=tuple(losses),
                     seconds=time.perf_counter() - t0, files=files)
