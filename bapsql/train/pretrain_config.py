"""The ``pretrain:`` section of a training config (`bapsql.train.config`): in-domain pretraining of a freshly built
tiny model (`bapsql.train.recipe.pretrain`)."""

from __future__ import annotations

from dataclasses import dataclass

from bapsql.errors import ConfigError


@dataclass(frozen=True)
class PretrainSection:
    """In-domain pretraining of a freshly built tiny model (`bapsql.train.recipe.pretrain`); when enabled it replaces
    ``model.base``. The corpus: whole episodes of ``workflows`` at ``budgets`` over ``augment_rounds`` rounds of
    augmented tasks on the training databases (`bapsql.data.augment`), at most ``corpus_episodes``, split evenly over
    ``conditions`` (empty: the training condition). Several conditions make a backbone that can act under each
    interface, as an instruction-tuned LLM can: the prompting rows of Table 2 then measure the interface, not a
    format the model never saw."""

    enabled: bool = False
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    max_positions: int = 16_384
    augment_rounds: int = 2
    corpus_episodes: int = 3000
    workflows: tuple[str, ...] = ("workflow.direct_aggregation",)
    budgets: tuple[str, ...] = ("XS", "S")
    conditions: tuple[str, ...] = ()  # conditions the corpus episodes are played under (empty: `condition`)
    steps: int = 1000
    batch: int = 8
    lr: float = 3e-3
    log_every: int = 100
    threads: int = 1  # torch threads for this stage (it runs alone: no engine or env worker competes)
    copy_batch: int = 0  # sequences of the synthetic copy task per step (bapsql.train.recipe.copy_task); 0: none
    copy_length: int = 24  # tokens of each copied run (a sequence is the run twice)
    copy_words: int = 90  # word-like tokens in the copy task's alphabet, beside the ten digits

    def __post_init__(self) -> None:
        if min(self.steps, self.batch, self.augment_rounds, self.corpus_episodes, self.log_every, self.threads) < 1 \
                or self.lr <= 0:
            raise ConfigError("pretrain: steps, batch, augment_rounds, corpus_episodes, log_every and threads must "
                              "be >= 1, lr > 0")
        if self.copy_batch < 0 or self.copy_length < 2 or self.copy_words < 0:
            raise ConfigError(f"pretrain: copy_batch must be >= 0 (0 turns the copy task off), copy_length >= 2 and "
                              f"copy_words >= 0; got {self.copy_batch}, {self.copy_length}, {self.copy_words}")
