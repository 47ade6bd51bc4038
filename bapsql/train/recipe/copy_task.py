"""A synthetic copy task interleaved with pretraining: grow the attention that copies tokens it has seen.

Why: a tiny model pretrained on episodes alone writes an answer's number from its prior instead of copying it out
of the tool response just above (teacher-forced, the 2,000-step model of the CPU recipe copied 13 of 89 multi-digit
result values correctly). Copying a run of tokens needs induction-style attention (find the previous occurrence of
the current token, emit the one after it), which grows quickly on short random sequences over a small alphabet and
slowly, if at all, from the corpus's few copies per episode. So each pretraining step adds, beside its batch of
episodes, the loss of ``n`` sequences ``s + s`` (``s``: ``length`` tokens drawn uniformly from the alphabet: the
ten digits and some word-like tokens), on the second ``s`` after its first token (the first is unpredictable).

Measured (benchmarks/RESULTS.md, "CPU learning recipe"): 800 steps with ``n = 16``, ``length = 24`` against the
same 800 steps without: result values copied into the answer 27 / 89 against 6 / 89, held-out completion NLL
0.29 against 0.32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from bapsql.errors import ConfigError


@dataclass(frozen=True)
class CopyTask:
    """The task's alphabet (token ids) and its size per step: ``n`` sequences of ``2 * length`` tokens."""

    alphabet: tuple[int, ...]
    n: int
    length: int

    def __post_init__(self) -> None:
        if self.n < 1 or self.length < 2 or len(self.alphabet) < 2:
            raise ConfigError("copy task: needs n >= 1 sequences, length >= 2 and an alphabet of >= 2 tokens")


def copy_alphabet(texts: Sequence[str], words: int, seed: int) -> tuple[int, ...]:
    """From ``texts`` (the decoded text of each token id): the ten digit tokens and ``words`` word-like tokens
    (printable, no quotes, digits, newlines or special markers), drawn with ``seed``. Raises `ConfigError` when the
    tokenizer has no single-token digits."""
    missing = [str(d) for d in range(10) if str(d) not in texts]
    if missing:
        raise ConfigError(f"pretrain.copy_batch: the tokenizer has no single token for the digits {missing}; "
                          "set pretrain.copy_batch: 0")
    digits = [texts.index(str(d)) for d in range(10)]
    wordish = [i for i, t in enumerate(texts) if t.strip() and t.isprintable() and not any(c.isdigit() for c in t)
               and not any(c in t for c in "'\"<|>")]
    rng = np.random.default_rng(seed)
    chosen = rng.choice(len(wordish), size=min(words, len(wordish)), replace=False)
    return tuple(digits) + tuple(wordish[int(i)] for i in sorted(chosen))


def copy_sequences(task: CopyTask, rng: np.random.Generator) -> tuple[Any, Any]:
    """``input_ids [n, 2*length]`` = ``s + s`` per row and ``labels`` (-100 except the second ``s`` after its
    first token), as `bapsql.train.recipe.pretrain.completion_loss` takes them."""
    import torch

    alphabet = np.asarray(task.alphabet)
    s = torch.as_tensor(alphabet[rng.integers(len(alphabet), size=(task.n, task.length))], dtype=torch.long)
    x = torch.cat([s, s], dim=1)
    y = torch.full_like(x, -100)
    y[:, task.length + 1:] = x[:, task.length + 1:]
    return x, y
