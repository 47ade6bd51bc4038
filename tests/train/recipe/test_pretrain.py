"""In-domain pretraining (bapsql/train/recipe/pretrain.py): the completion-only loss against a reference over full
logits, and that a few steps on a small copy corpus lower it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from bapsql.train.recipe.pretrain import _batch, completion_loss, train_sequences  # noqa: E402


def _model(seed=0):
    cfg = transformers.Qwen2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                   tie_word_embeddings=False, pad_token_id=0)
    torch.manual_seed(seed)
    return transformers.Qwen2ForCausalLM(cfg).eval()


def _copy_rows(n, seed=0):
    """``[1, a, b, c, 2, a, b, c, 3]``: the completion (after the 2) copies the three tokens before it."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        body = torch.randint(4, 64, (3,), generator=g).tolist()
        ids = [1, *body, 2, *body, 3]
        rows.append({"input_ids": ids, "loss_mask": [0] * 5 + [1] * 4})
    return rows


def test_completion_loss_matches_the_full_logit_reference():
    model = _model()
    rows = _copy_rows(3) + [{"input_ids": [1, 5, 2, 6], "loss_mask": [0, 0, 1, 1]}]
    x, y = _batch(rows, pad=0)
    got = completion_loss(model, x, y, reduction="sum")
    logits = model(input_ids=x).logits
    want, n = 0.0, 0
    for b, r in enumerate(rows):
        for t in range(1, len(r["input_ids"])):
            if r["loss_mask"][t]:
                want += -float(torch.log_softmax(logits[b, t - 1], -1)[r["input_ids"][t]])
                n += 1
    assert float(got) == pytest.approx(want, rel=1e-4)
    assert float(completion_loss(model, x, y)) == pytest.approx(want / n, rel=1e-4)


def test_training_lowers_held_out_completion_nll():
    model = _model()
    curve, tokens, _ = train_sequences(model, _copy_rows(256), steps=60, batch=16, lr=3e-3, seed=0, pad=0,
                                       heldout=_copy_rows(32, seed=1), log_every=59, warmup=5)
    assert tokens == 60 * 16 * 9
    assert curve[-1]["heldout_nll"] < curve[0]["heldout_nll"] - 0.3


def test_heldout_metrics_agree_with_the_loss_and_count_exact_completions():
    from bapsql.train.recipe.pretrain import heldout_metrics, heldout_nll

    model = _model()
    rows = _copy_rows(8)
    m = heldout_metrics(model, rows, pad=0)
    x, y = _batch(rows, pad=0)
    assert m["nll"] == pytest.approx(float(completion_loss(model, x, y)), rel=1e-4) == heldout_nll(model, rows, 0)
    logits = model(input_ids=x).logits
    want_exact = sum(all(int(logits[b, t - 1].argmax()) == r["input_ids"][t]
                         for t in range(1, len(r["input_ids"])) if r["loss_mask"][t]) for b, r in enumerate(rows))
    assert m["exact"] == want_exact / len(rows) and 0 <= m["token_acc"] <= 1


def test_shares_split_the_corpus_evenly_and_refuse_too_few_episodes():
    from hypothesis import given
    from hypothesis import strategies as st

    from bapsql.errors import ConfigError
    from bapsql.train.recipe.pretrain import _shares

    @given(st.integers(1, 500), st.integers(1, 8))
    def check(total, k):
        if total < k:
            with pytest.raises(ConfigError, match="corpus_episodes"):
                _shares(total, k)
            return
        parts = _shares(total, k)
        assert len(parts) == k and sum(parts) == total and max(parts) - min(parts) <= 1 and min(parts) >= 1

    check()


def test_a_bad_pretrain_condition_is_named():
    from bapsql.config import from_mapping
    from bapsql.errors import ConfigError
    from bapsql.train.config import TrainConfig

    with pytest.raises(ConfigError, match=r"pretrain\.conditions\[1\]"):
        from_mapping(TrainConfig, {"name": "x", "model": {"base": "builtin:tiny"},
                                   "pretrain": {"conditions": ["raw", "nope"]}})


def test_corpus_holds_an_equal_share_of_episodes_under_each_condition(tmp_path):
    """Two conditions: half the corpus episodes under each, and only the dashboard condition's show the budget
    line (the raw interface shows none), so the backbone sees both interfaces."""
    import pyarrow.parquet as pq

    from bapsql.config import from_mapping
    from bapsql.models.chat_template import ChatTemplate
    from bapsql.train.config import TrainConfig
    from bapsql.train.recipe.pretrain import run_pretrain

    cfg = from_mapping(TrainConfig, {
        "name": "p", "out_dir": str(tmp_path), "prompt_style": "terse", "model": {"base": "builtin:tiny"},
        "data": {"split": "train", "eval_split": "test"},
        "pretrain": {"enabled": True, "steps": 1, "batch": 2, "corpus_episodes": 12, "augment_rounds": 1,
                     "log_every": 1, "hidden_size": 32, "num_layers": 1, "num_heads": 1, "num_kv_heads": 1,
                     "intermediate_size": 64, "max_positions": 4096, "conditions": ["raw", "dashboard"]}})
    run = tmp_path / "p-seed0"
    result = run_pretrain(cfg, 0, run)
    assert result.corpus_episodes == 12
    rows = pq.read_table(run / "pretrain" / "corpus.parquet").to_pylist()
    template = ChatTemplate.from_dir(run / "pretrain" / "model")
    shown = [("[left]" in template.decode(r["input_ids"])) for r in rows]
    assert sum(shown) == 6, shown
    assert not list((run / "pretrain").glob("corpus-*.parquet"))  # the parts were merged and dropped
