"""The learner's settings: what `bapsql.train.learner.core.Learner` needs (`LearnerConfig`), with its optimizer
(`OptimConfig`) and LoRA (`LoraSpec`, also the ``lora:`` section of a training config), the `Dtype` names and
`LORA_TARGETS`. ``dtype: auto`` (the default) loads the checkpoint in 16-bit on a GPU (its own 16-bit dtype, else
bfloat16) and in float32 on the CPU (`bapsql.models.dtype.resolve_dtype`), as the engines do.

`bapsql.train.config.TrainConfig.learner_config` builds a `LearnerConfig` for a stage of a training recipe;
`bapsql.train.config` re-exports every name here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from bapsql.errors import ConfigError

LORA_TARGETS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # Qwen2
Dtype = Literal["auto", "float32", "bfloat16", "float16"]  # auto: bf16 on GPU, fp32 on CPU (models.dtype)


@dataclass(frozen=True)
class LoraSpec:
    """LoRA on the model's projections (paper: rank 32). ``target_modules: null`` (the default) adapts the
    decoder's attention and MLP projections the architecture names (q/k/v/o, gate/up/down and the fused
    qkv_proj / gate_up_proj / GPT-2's c_attn; `bapsql.train.learner.model_parts.discover_lora_targets`); vision towers,
    linear-attention blocks and any other linear are adapted only when listed. A list overrides the default."""

    rank: int = 32
    alpha: int = 64
    dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.rank < 1 or self.alpha < 1:
            raise ConfigError(f"lora: rank and alpha must be >= 1, got {self.rank}, {self.alpha}")
        if not 0 <= self.dropout < 1:
            raise ConfigError(f"lora.dropout: must be in [0, 1), got {self.dropout}")
        if self.target_modules is not None and not self.target_modules:
            raise ConfigError("lora.target_modules: name at least one module, or null to adapt the attention and "
                              "MLP projections")


@dataclass(frozen=True)
class OptimConfig:
    """AdamW + schedule. ``total_steps`` is filled in by the stage (optimizer steps: SFT's steps; GRPO's updates x
    epochs x mini_batches)."""

    lr: float = 1e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 0
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    total_steps: int = 1
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if self.lr <= 0 or self.max_grad_norm <= 0:
            raise ConfigError(f"optim: lr and max_grad_norm must be > 0, got {self.lr}, {self.max_grad_norm}")
        if self.warmup_steps < 0 or self.total_steps < 1:
            raise ConfigError("optim: warmup_steps must be >= 0 and total_steps >= 1")


@dataclass(frozen=True)
class LearnerConfig:
    """What `bapsql.train.learner.core.Learner` needs."""

    model_path: str
    lora: LoraSpec = LoraSpec()
    optim: OptimConfig = OptimConfig()
    adapter_path: str | None = None
    micro_batch_tokens: int = 16_384
    dtype: Dtype = "auto"
    device: str = "auto"
    threads: int | None = 1
    gradient_checkpointing: bool = False
    seed: int = 0
    temperature: float = 1.0  # logprobs of logits / temperature: the distribution rollouts were sampled from
    # ... renormalised over the top-p / top-k nucleus the engine sampled from (bapsql.train.algo.logprobs; 1 / 0: off)
    top_p: float = 1.0
    top_k: int = 0
    # LM head + log-softmax this many positions at a time; null: sized by the vocabulary (~128 MiB of logits per
    # chunk, bapsql.train.algo.logprobs.auto_chunk); 0: all logits at once (the plain path)
    logprob_chunk_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.micro_batch_tokens < 1:
            raise ConfigError(f"micro_batch_tokens: must be >= 1, got {self.micro_batch_tokens}")
        if not self.temperature > 0:
            raise ConfigError(f"learner temperature: must be > 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"learner top_p: must be in (0, 1] (1: no nucleus), got {self.top_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ConfigError(f"learner top_k: must be an integer >= 0 (0: no top-k), got {self.top_k!r}")
        if self.logprob_chunk_tokens is not None and self.logprob_chunk_tokens < 0:
            raise ConfigError(f"logprob_chunk_tokens: must be >= 0, got {self.logprob_chunk_tokens}")
