"""scripts/gpu_check.{sh,py} (issue 31): the prepared check for a lent GPU that has no vllm and no ray. Fast: the
architecture it builds, the tokenizer that covers its vocabulary, the module blocker, the setup exits. Slow: the
whole check rehearsed on the CPU (``--cpu``) through the shell script, with ray made unimportable."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"
sys.path.insert(0, str(SCRIPTS))

torch = pytest.importorskip("torch")
import gpu_check  # noqa: E402
import gpu_check_model  # noqa: E402


def test_the_qwen3_06b_shape_is_the_published_one():
    """Qwen3-0.6B: hidden 1024, 28 layers, 16 x 128 query heads, 8 KV heads, MLP 3072, 151,936 ids, tied embeddings,
    RoPE theta 1e6 — 596M parameters, 440M of them outside the (tied) embedding."""
    from transformers import AutoConfig, AutoModelForCausalLM

    spec = dict(gpu_check_model.ARCHS["qwen3-0.6b"])
    config = AutoConfig.for_model(spec.pop("model_type"), **spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    embedding = config.vocab_size * config.hidden_size
    assert (config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads, config.head_dim,
            config.intermediate_size, config.vocab_size) == (28, 16, 8, 128, 3072, 151_936)
    assert config.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert round(total / 1e6) == 596 and round((total - embedding) / 1e6) == 440


def test_the_tokenizer_covers_every_id_and_encodes_as_the_packaged_one(tmp_path):
    from tokenizers import Tokenizer

    from bapsql.models.chat_template import ChatTemplate
    from bapsql.tokens import DEFAULT_TOKENIZER_DIR

    assert gpu_check_model.extend_tokenizer(DEFAULT_TOKENIZER_DIR, tmp_path, 151_936) == 151_936
    packaged, extended = (Tokenizer.from_file(str(d / "tokenizer.json")) for d in (DEFAULT_TOKENIZER_DIR, tmp_path))
    text = "<|im_start|>user\nHow many orders in 2023?<|im_end|>\n<tool_call>SELECT COUNT(*) FROM t</tool_call>"
    assert extended.encode(text).ids == packaged.encode(text).ids
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>"):
        assert extended.token_to_id(token) == packaged.token_to_id(token)  # the specials keep their ids
    assert all(len(extended.decode([i]).encode("utf-8", "replace")) > 0 for i in (8192, 100_000, 151_935))
    template = ChatTemplate.from_dir(tmp_path)
    assert template.framing().end_of_turn_text.startswith("<|im_end|>")


def test_the_tiny_arch_is_built_with_random_weights_and_its_tokenizer(tmp_path):
    from transformers import AutoModelForCausalLM

    info = gpu_check_model.build_arch_model("qwen3-tiny", tmp_path / "m", device="cpu", dtype="float32")
    assert info.vocab_size == info.tokenizer_entries == 16_384 and info.layers == 2
    model = AutoModelForCausalLM.from_pretrained(info.path)
    assert type(model).__name__ == "Qwen3ForCausalLM" and model.config.tie_word_embeddings
    again = gpu_check_model.folder_model(info.path)
    assert again.parameters == info.parameters  # from the safetensors headers: the tied head is saved once
    with pytest.raises(SystemExit, match="unknown 'llama-7b'"):
        gpu_check_model.build_arch_model("llama-7b", tmp_path / "x", device="cpu", dtype="float32")


def test_a_blocked_module_cannot_be_imported():
    blocker = gpu_check.Blocked({"bapsql_no_such_pkg", "json_blocked"})
    sys.meta_path.insert(0, blocker)
    try:
        with pytest.raises(ModuleNotFoundError, match="blocked by gpu_check"):
            import json_blocked.sub  # noqa: F401
    finally:
        sys.meta_path.remove(blocker)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible")
def test_without_a_gpu_the_check_says_so_and_exits_2(tmp_path, capsys):
    assert gpu_check.main(["--out", str(tmp_path)]) == 2
    assert "no CUDA device" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        gpu_check.main(["--out", str(tmp_path), "--cpu", "--steps", "learner,warp"])


@pytest.mark.slow
def test_the_cpu_rehearsal_passes_every_step_without_ray(tmp_path):
    """`bash scripts/gpu_check.sh --cpu --without ray`: every step passes on the toy architecture, ray is never
    imported, and the JSON report holds the verdict and every step's measurements."""
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "2"}
    env.pop("BAPSQL_CACHE_DIR", None)
    run = subprocess.run(["bash", str(SCRIPTS / "gpu_check.sh"), "--cpu", "--without", "ray"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["ok"] and report["imported"]["ray"] is False and report["blocked"] == ["ray"]
    assert [k for k, v in report["steps"].items() if v["status"] == "ok"] == list(gpu_check.ORDER)
    steps = report["steps"]
    assert steps["learner"]["data"]["tokens_per_s"] > 0 and steps["learner"]["data"]["level"] == "XS"
    assert steps["agreement"]["data"]["hf"]["probe_mean"] < 1e-3
    assert all(steps["stale"]["data"]["caught"].values())
    assert steps["eval"]["data"]["episodes"] == 16
    assert "verdict: READY (7/7 steps ok)" in run.stdout and (tmp_path / "gpu_check.log").is_file()
