"""The synthetic copy task interleaved with pretraining (bapsql/train/recipe/copy_task.py)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from bapsql.errors import ConfigError

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bapsql.train.recipe.copy_task import CopyTask, copy_alphabet, copy_sequences  # noqa: E402
from bapsql.train.recipe.pretrain import completion_loss, train_sequences  # noqa: E402


def test_sequences_repeat_a_run_from_the_alphabet_and_score_only_the_predictable_copy():
    task = CopyTask(alphabet=(5, 6, 7, 9), n=3, length=6)
    x, y = copy_sequences(task, np.random.default_rng(0))
    assert x.shape == y.shape == (3, 12)
    assert torch.equal(x[:, :6], x[:, 6:]) and set(x.flatten().tolist()) <= {5, 6, 7, 9}
    assert (y[:, :7] == -100).all() and torch.equal(y[:, 7:], x[:, 7:])
    x2, _ = copy_sequences(task, np.random.default_rng(1))
    assert not torch.equal(x, x2)


def test_the_alphabet_is_the_digits_then_word_like_tokens_of_the_packaged_tokenizer():
    from bapsql.tokens import DEFAULT_TOKENIZER_DIR

    tok = transformers.AutoTokenizer.from_pretrained(DEFAULT_TOKENIZER_DIR)
    texts = tok.batch_decode([[i] for i in range(len(tok))])
    alphabet = copy_alphabet(texts, words=40, seed=0)
    assert [tok.decode([i]) for i in alphabet[:10]] == [str(d) for d in range(10)]
    words = [tok.decode([i]) for i in alphabet[10:]]
    assert len(words) == 40 and all(w.strip() and not any(c in w for c in "0123456789'\"<|>\n") for w in words)
    assert copy_alphabet(texts, words=40, seed=0) == alphabet


def test_a_tokenizer_without_digit_tokens_and_bad_sizes_are_refused():
    with pytest.raises(ConfigError, match="copy_batch"):
        copy_alphabet(["a", "b"], words=1, seed=0)
    with pytest.raises(ConfigError, match="copy task"):
        CopyTask(alphabet=(1, 2), n=0, length=4)


def _model():
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                   tie_word_embeddings=False, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.Qwen2ForCausalLM(cfg)


def _constant_rows(n):
    """Episodes whose completion is always the same: nothing in them asks for copying."""
    rng = np.random.default_rng(0)
    return [{"input_ids": [1, *rng.integers(4, 64, 4).tolist(), 2, 3, 3], "loss_mask": [0] * 6 + [1, 1]}
            for _ in range(n)]


STEPS = 60


@pytest.mark.slow
def test_the_copy_task_teaches_copying_that_the_episodes_alone_do_not():
    """Side by side from the same start: only the run with the copy task lowers the loss of copying fresh runs;
    the episodes are drawn in the same order either way (equal step-0 loss), and the task's tokens are counted."""
    task = CopyTask(alphabet=tuple(range(4, 64)), n=16, length=8)
    probe_x, probe_y = copy_sequences(dataclasses.replace(task, n=64), np.random.default_rng(99))
    results = {}
    for name, copy in (("without", None), ("with", task)):
        model = _model()
        curve, tokens, _ = train_sequences(model, _constant_rows(64), steps=STEPS, batch=8, lr=1e-2, seed=0, pad=0,
                                           log_every=STEPS - 1, warmup=5, copy=copy)
        with torch.no_grad():
            results[name] = (float(completion_loss(model.eval(), probe_x, probe_y)), curve, tokens)
    (without, c0, t0), (with_copy, c1, t1) = results["without"], results["with"]
    assert c0[0]["loss"] == c1[0]["loss"]
    assert t1 - t0 == STEPS * 16 * 16
    assert with_copy < 0.5 * without, (with_copy, without)


def test_the_config_names_bad_copy_keys():
    from bapsql.train.config import PretrainSection

    with pytest.raises(ConfigError, match="copy_batch"):
        PretrainSection(copy_batch=-1)
    assert PretrainSection().copy_batch == 0
