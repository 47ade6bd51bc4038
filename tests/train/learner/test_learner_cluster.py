"""What would break or silently stop learning on a cluster: dropout noise in the policy-gradient forward pass, a
learner that ignores the sampling temperature, memory-bound logprobs, LoRA targets that miss projections, and a
merged folder missing files of the base."""

import json
import random
import shutil

import numpy as np
import pytest

from bapsql.train.algo.grpo import LossConfig
from bapsql.train.learner.core import Sample

torch = pytest.importorskip("torch")


def samples(n=4, length=24, prompt=12, seed=0):
    rng = random.Random(seed)
    return [Sample(tuple(rng.randrange(100, 8000) for _ in range(length)), tuple([0] * prompt + [1] * (length - prompt)))
            for _ in range(n)]


def learner_cfg(model_path, **kw):
    from bapsql.train.config import LearnerConfig, LoraSpec, OptimConfig

    lora = kw.pop("lora", LoraSpec(rank=8, alpha=16))
    return LearnerConfig(model_path=str(model_path), lora=lora, optim=OptimConfig(lr=kw.pop("lr", 2e-2)),
                         dtype="float32", device="cpu", threads=1, **kw)


# ------------------------------------------------------------------------------------------------------ dropout
def test_policy_gradient_logprobs_carry_no_dropout_noise(tiny_model_dir, tmp_path):
    from bapsql.train.config import LoraSpec
    from bapsql.train.learner.core import Learner

    model = tmp_path / "dropout-model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    config["attention_dropout"] = 0.5
    (model / "config.json").write_text(json.dumps(config))
    learner = Learner(learner_cfg(model, lora=LoraSpec(rank=8, alpha=16, dropout=0.5)))
    s = samples()
    for _ in range(2):
        learner.sft_update(s)  # B != 0: the LoRA dropout now changes the output when active
    clean = learner.token_logprobs(s)  # eval mode: what a noise-free engine reports
    batch = [Sample(x.input_ids, x.loss_mask, tuple(lp), 1.0) for x, lp in zip(s, clean)]
    m = learner.grpo_update(batch, LossConfig())
    # mismatch = Σ |learner logp in the update − engine logp|: the recomputed logprobs equal the clean ones
    assert m.stats.mismatch / m.stats.tokens < 1e-4
    assert m.stats.is_truncated == 0


# -------------------------------------------------------------------------------------------------- temperature
def _chat_prompt(model_dir):
    from bapsql.models.chat_template import ChatTemplate

    t = ChatTemplate.from_dir(model_dir)
    return t.apply([{"role": "system", "content": "You write SQL."},
                    {"role": "user", "content": "How many orders were placed?"}], add_generation_prompt=True)


@pytest.mark.slow  # several seconds: the slow tier
def test_learner_and_engine_logprobs_use_the_sampling_temperature(pretrained_tiny_dir):
    """At T = 0.7 the engine reports the logprob of the distribution it sampled from (logits / T), and the learner
    a GRPO config builds recomputes exactly that."""
    from transformers import AutoModelForCausalLM

    from bapsql.rollout.engines.base import EngineConfig, SamplingParams
    from bapsql.rollout.engines.hf import HFEngine
    from bapsql.train.config import GRPOSection, ModelSection, TrainConfig
    from bapsql.train.learner.core import Learner

    T = 0.7
    prompt = _chat_prompt(pretrained_tiny_dir)
    engine = HFEngine(EngineConfig(kind="hf", model=str(pretrained_tiny_dir), dtype="float32", device="cpu",
                                   num_threads=1, max_model_len=2048))
    gen = engine.generate([prompt], [SamplingParams(max_tokens=16, temperature=T, top_p=1.0, seed=3)])[0]
    nucleus = engine.generate([prompt], [SamplingParams(max_tokens=16, temperature=T, top_p=0.5, seed=3)])[0]
    engine.close()
    ids = list(prompt) + list(gen.completion_ids)
    model = AutoModelForCausalLM.from_pretrained(pretrained_tiny_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0, len(prompt) - 1:-1].float()
    target = torch.tensor(gen.completion_ids)[:, None]
    sampled_from = torch.log_softmax(logits / T, dim=-1).gather(1, target)[:, 0].numpy()
    raw = torch.log_softmax(logits, dim=-1).gather(1, target)[:, 0].numpy()
    assert np.abs(sampled_from - raw).max() > 1e-2  # the two really differ on this prompt
    np.testing.assert_allclose(gen.logprobs, sampled_from, atol=1e-4)

    cfg = TrainConfig(name="t", model=ModelSection(base=str(pretrained_tiny_dir), dtype="float32", device="cpu",
                                                   threads=1), grpo=GRPOSection(temperature=T, top_p=1.0))
    learner = Learner(cfg.learner_config(pretrained_tiny_dir, "grpo", seed=0, total_steps=1))
    mask = [0] * len(prompt) + [1] * len(gen.completion_ids)
    lp = learner.token_logprobs([Sample(tuple(ids), tuple(mask))])[0][len(prompt):]
    np.testing.assert_allclose(lp, gen.logprobs, atol=1e-4)
    # top-p: the engine reports the renormalised nucleus logprob, never below the full-vocabulary one
    ids_p = list(prompt) + list(nucleus.completion_ids)
    mask_p = [0] * len(prompt) + [1] * len(nucleus.completion_ids)
    full = learner.token_logprobs([Sample(tuple(ids_p), tuple(mask_p))])[0][len(prompt):]
    assert np.all(np.asarray(nucleus.logprobs) >= full - 1e-5)


# ------------------------------------------------------------------------------------------- chunked logprobs
def test_chunked_and_plain_logprob_paths_agree_in_values_and_updates(tiny_model_dir):
    from bapsql.train.learner.core import Learner

    s = samples(5, length=40, prompt=10)
    a = Learner(learner_cfg(tiny_model_dir, logprob_chunk_tokens=7))
    b = Learner(learner_cfg(tiny_model_dir, logprob_chunk_tokens=0))
    for x, y in zip(a.token_logprobs(s), b.token_logprobs(s)):
        np.testing.assert_allclose(x, y, atol=1e-5)
    ma, mb = a.sft_update(s), b.sft_update(s)
    assert ma.loss == pytest.approx(mb.loss, rel=1e-5) and ma.grad_norm == pytest.approx(mb.grad_norm, rel=1e-4)
    for x, y in zip(a.token_logprobs(s, masked_only=True), b.token_logprobs(s, masked_only=True)):
        np.testing.assert_allclose(x, y, atol=1e-5)


# ---------------------------------------------------------------------------------------------- LoRA targets
def _linear_attention_model(out):
    """A tiny Qwen3.5-class model (Gated DeltaNet linear-attention layer + full-attention layer, dense MLPs)."""
    from transformers import AutoModelForCausalLM, Qwen3_5TextConfig

    from bapsql.tokens import DEFAULT_TOKENIZER_DIR

    cfg = Qwen3_5TextConfig(vocab_size=8192, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_value_heads=4,
                            linear_num_key_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                            layer_types=["linear_attention", "full_attention"])
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(out)
    for f in DEFAULT_TOKENIZER_DIR.iterdir():
        shutil.copy(f, out / f.name)
    return out


def test_lora_targets_default_to_attention_and_mlp_projections_not_linear_attention(tmp_path):
    from bapsql.train.config import LoraSpec
    from bapsql.train.learner.core import Learner
    from bapsql.train.learner.model_parts import PROJECTIONS, discover_lora_targets

    from transformers import AutoModelForCausalLM

    model = _linear_attention_model(tmp_path / "qwen3.5-tiny")
    plain = AutoModelForCausalLM.from_pretrained(model)
    head = plain.get_output_embeddings()
    linear = {n for n, m in plain.named_modules() if isinstance(m, torch.nn.Linear) and m is not head}
    assert any("linear_attn" in n for n in linear) and any("self_attn" in n for n in linear)
    targets = discover_lora_targets(plain)
    assert set(targets) == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    learner = Learner(learner_cfg(model))
    wrapped = dict(learner.model.get_base_model().named_modules())
    projections = {n for n in linear if n.rsplit(".", 1)[-1] in PROJECTIONS}
    assert projections and all(hasattr(wrapped[n], "lora_A") for n in projections)  # attention + both layers' MLPs
    assert not any(hasattr(wrapped[n], "lora_A") for n in linear - projections)  # the Gated DeltaNet block's
    assert any("linear_attn" in n for n in linear - projections)
    assert not hasattr(learner.model.get_base_model().get_output_embeddings(), "lora_A")
    listed = Learner(learner_cfg(model, lora=LoraSpec(rank=4, alpha=8, target_modules=("q_proj", "in_proj_z"))))
    names = {n.split(".lora_A.")[0] for n, _ in listed.model.named_parameters() if ".lora_A." in n}
    assert names and {n.rsplit(".", 1)[-1] for n in names} == {"q_proj", "in_proj_z"}  # a list wins


def test_merge_copies_every_non_weight_file_of_the_base(tiny_model_dir, tmp_path):
    from bapsql.train.learner.core import Learner

    base = tmp_path / "base"
    shutil.copytree(tiny_model_dir, base)
    extras = {"vocab.json": "{}", "merges.txt": "#version: 0.2\n", "added_tokens.json": "{}",
              "preprocessor_config.json": "{}", "README.md": "a model card"}
    for name, text in extras.items():
        (base / name).write_text(text)
    learner = Learner(learner_cfg(base))
    learner.sft_update(samples(2))
    merged = learner.merge_and_save(tmp_path / "merged")
    for f in base.iterdir():
        if f.suffix not in (".safetensors", ".bin"):
            assert (merged / f.name).is_file(), f.name
    for name, text in extras.items():
        assert (merged / name).read_text() == text
    assert (merged / "model.safetensors").read_bytes() != (base / "model.safetensors").read_bytes()
