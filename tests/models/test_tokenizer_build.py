"""The packaged tokenizer and its deterministic builder (bapsql/models/tokenizer_build.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from bapsql.models import tokenizer_build as tb
from bapsql.models import tokenizer_corpus as corpus
from bapsql.tokens import DEFAULT_TOKENIZER_DIR, load_token_counter

FILES = ("special_tokens_map.json", "tokenizer.json", "tokenizer_config.json")


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return Tokenizer.from_file(str(DEFAULT_TOKENIZER_DIR / "tokenizer.json"))


@pytest.mark.slow  # several seconds: the slow tier
def test_packaged_files_are_what_the_builder_writes(tmp_path):
    # Built in another process when the package was made: equal bytes also show cross-process determinism.
    result = tb.build_tokenizer(tmp_path)
    assert result.vocab_size == 8192
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (DEFAULT_TOKENIZER_DIR / name).read_bytes(), name
    assert (DEFAULT_TOKENIZER_DIR / "tokenizer.json").stat().st_size < 1_000_000


def test_cli_rebuild_is_byte_identical(tmp_path):
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        proc = subprocess.run([sys.executable, "-m", "bapsql.models.tokenizer_build", "--out", str(out),
                               "--vocab-size", "400", "--scale", "0.02"], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert "vocab 400" in proc.stdout
        outs.append(out)
    for name in FILES:
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name


def test_cli_rejects_bad_input_without_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bapsql.models.tokenizer_build", "--out", str(tmp_path),
                           "--vocab-size", "10"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and "--vocab-size" in proc.stderr


def test_corpus_is_deterministic_and_seeded():
    a = list(corpus.corpus_lines(0.01, seed=3))
    assert a == list(corpus.corpus_lines(0.01, seed=3))
    assert a != list(corpus.corpus_lines(0.01, seed=4))
    assert len(a) == len(corpus.SQL_KEYWORDS) + 600


def test_special_tokens_follow_the_vocabulary_like_qwen2(tok):
    ids = [tok.token_to_id(t) for t, _ in tb.SPECIAL_TOKENS]
    assert ids == list(range(8192 - 7, 8192))
    added = tok.get_added_tokens_decoder()
    assert {added[i].content: added[i].special for i in ids} == dict(tb.SPECIAL_TOKENS)
    # special-token strings in text map to their single ids
    assert tok.encode("<|im_start|>user\nhi<|im_end|>").ids[0] == ids[1]
    assert tok.encode("<tool_call>").ids == [ids[3]]


def test_config_files_describe_a_qwen2_tokenizer():
    cfg = json.loads((DEFAULT_TOKENIZER_DIR / "tokenizer_config.json").read_text())
    assert cfg["tokenizer_class"] == "Qwen2Tokenizer"
    assert cfg["eos_token"] == "<|im_end|>" and cfg["pad_token"] == "<|endoftext|>"
    assert cfg["chat_template"] == tb.CHAT_TEMPLATE
    assert cfg["model_max_length"] == tb.MODEL_MAX_LENGTH
    assert {v["content"] for v in cfg["added_tokens_decoder"].values()} == {t for t, _ in tb.SPECIAL_TOKENS}
    smap = json.loads((DEFAULT_TOKENIZER_DIR / "special_tokens_map.json").read_text())
    assert smap["eos_token"]["content"] == "<|im_end|>"


def test_sql_keywords_and_common_words_are_single_tokens(tok):
    for kw in corpus.SQL_KEYWORDS:
        if kw in ("CREATE", "EXPLAIN"):  # statement openers: seen at the start, without a leading space
            assert len(tok.encode(kw).ids) == 1, kw
            continue
        assert len(tok.encode(" " + kw).ids) == 1, kw
        assert len(tok.encode(" " + kw.lower()).ids) == 1, kw.lower()
    for word in corpus.COMMON_WORDS + corpus.MORE_WORDS:
        assert len(tok.encode(" " + word).ids) == 1, word
    for header in ("system", "user", "assistant"):
        assert len(tok.encode("<|im_start|>" + header).ids) == 2, header


def test_digits_are_split_one_by_one(tok):
    assert tok.encode("2024").tokens == ["2", "0", "2", "4"]
    assert tok.encode("SELECT COUNT(*) FROM singer WHERE age > 30").tokens == [
        "SELECT", "ĠCOUNT", "(*)", "ĠFROM", "Ġsinger", "ĠWHERE", "Ġage", "Ġ>", "Ġ", "3", "0"]


@settings(max_examples=150, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_decode_inverts_encode_up_to_nfc(tok, text):
    assert tok.decode(tok.encode(text).ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_default_token_counter_uses_the_packaged_tokenizer(tok):
    counter = load_token_counter("default")
    text = "How many singers are from France? SELECT COUNT(*) FROM singer WHERE country = 'France'"
    assert counter.count(text) == len(tok.encode(text).ids)
