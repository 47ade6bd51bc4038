"""The tiny Qwen2-architecture model: built locally, deterministic, loadable by transformers; and its CLI."""

from __future__ import annotations

import hashlib
import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from bapsql.cli import cli  # noqa: E402
from bapsql.errors import ConfigError  # noqa: E402
from bapsql.models.tiny import TOKENIZER_FILES, TinySpec, make_tiny_model  # noqa: E402
from bapsql.tokens import DEFAULT_TOKENIZER_DIR  # noqa: E402


def _digest(path):
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_builds_an_untied_float32_qwen2_folder(tmp_path):
    result = make_tiny_model(tmp_path / "m", seed=0)
    out = result.out_dir
    assert {"config.json", "generation_config.json", "model.safetensors", *TOKENIZER_FILES} <= set(result.files)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["model_type"] == "qwen2" and cfg["architectures"] == ["Qwen2ForCausalLM"]
    assert cfg["tie_word_embeddings"] is False
    assert (cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["intermediate_size"]) == (128, 4, 4, 2, 384)
    tok = json.loads((DEFAULT_TOKENIZER_DIR / "tokenizer.json").read_text())
    n_vocab = len(tok["model"]["vocab"]) + len(tok["added_tokens"])
    assert cfg["vocab_size"] == result.vocab_size == n_vocab
    assert 2_000_000 < result.num_parameters < 5_000_000
    gen = json.loads((out / "generation_config.json").read_text())
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    assert set(gen["eos_token_id"]) == {ids["<|im_end|>"], ids["<|endoftext|>"]}
    assert gen["pad_token_id"] == ids["<|endoftext|>"]
    for name in TOKENIZER_FILES:
        assert (out / name).read_bytes() == (DEFAULT_TOKENIZER_DIR / name).read_bytes()


def test_loads_in_transformers_and_runs_a_forward_pass(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = make_tiny_model(tmp_path / "m", seed=3).out_dir
    model = AutoModelForCausalLM.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert model.dtype == torch.float32
    assert model.get_input_embeddings().weight.data_ptr() != model.get_output_embeddings().weight.data_ptr()
    ids = tokenizer("SELECT count(*) FROM singer", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size)
    assert torch.isfinite(logits).all()
    assert tokenizer.eos_token == "<|im_end|>"


def test_deterministic_from_the_seed(tmp_path):
    a = make_tiny_model(tmp_path / "a", seed=7)
    b = make_tiny_model(tmp_path / "b", seed=7)
    c = make_tiny_model(tmp_path / "c", seed=8)
    assert _digest(a.out_dir) == _digest(b.out_dir) != _digest(c.out_dir)


@pytest.mark.slow  # several seconds: the slow tier
def test_pretraining_lowers_the_loss(tmp_path):
    result = make_tiny_model(tmp_path / "m", seed=0, pretrain_steps=12)
    assert result.pretrain_steps == 12 and len(result.losses) == 3  # steps 0, 10 and the last
    assert result.losses[-1] < result.losses[0] - 0.5
    assert _digest(result.out_dir) != _digest(make_tiny_model(tmp_path / "plain", seed=0).out_dir)


def test_bad_spec_and_arguments_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="divide"):
        TinySpec(hidden_size=130, num_heads=4)
    with pytest.raises(ConfigError, match="pretrain_steps"):
        make_tiny_model(tmp_path / "m", pretrain_steps=-1)
    with pytest.raises(ConfigError, match="tokenizer"):
        make_tiny_model(tmp_path / "m", tokenizer_dir=tmp_path)


def test_cli_make_tiny_writes_and_refuses_to_overwrite(tmp_path):
    runner = CliRunner()
    out = tmp_path / "tiny"
    result = runner.invoke(cli, ["model", "make-tiny", "--out", str(out), "--seed", "1"])
    assert result.exit_code == 0, result.output
    assert "parameters" in result.output and (out / "model.safetensors").is_file()
    again = runner.invoke(cli, ["model", "make-tiny", "--out", str(out)])
    assert again.exit_code == 2 and "--force" in again.output and "Traceback" not in again.output
    forced = runner.invoke(cli, ["model", "make-tiny", "--out", str(out), "--force", "--seed", "2"])
    assert forced.exit_code == 0, forced.output


def test_cli_sample_generates_with_the_hf_engine(tmp_path):
    out = make_tiny_model(tmp_path / "m", seed=0).out_dir
    runner = CliRunner()
    args = ["model", "sample", "--model", str(out), "--prompt", "How many singers are there?", "--max-tokens", "5"]
    first = runner.invoke(cli, args + ["--chat"])
    assert first.exit_code == 0, first.output
    assert "5 completion tokens" in first.output and "ids [" in first.output
    assert runner.invoke(cli, args + ["--chat"]).output == first.output  # greedy by default: deterministic
    missing = runner.invoke(cli, ["model", "sample", "--model", str(tmp_path / "none"), "--prompt", "x"])
    assert missing.exit_code == 2 and "make-tiny" in missing.output and "Traceback" not in missing.output
