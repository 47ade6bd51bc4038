"""Shared fixtures: a tiny Qwen2-architecture model built once per test session (no download)."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from bapsql.models.tiny import TinySpec, make_tiny_model

    out = tmp_path_factory.mktemp("tiny-model")
    make_tiny_model(out, seed=0, spec=TinySpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                                              intermediate_size=128, max_position_embeddings=2048))
    return out


@pytest.fixture(scope="session")
def pretrained_tiny_dir(tmp_path_factory) -> Path:
    """The small tiny model after 150 steps of next-token pretraining on the tokenizer corpus (~30 s): its output
    layer is no longer random, so after a chat prompt it puts real mass on a few openings (``{"``, ``You``,
    ``<tool_call>``) that a policy can learn to choose between."""
    pytest.importorskip("torch")
    pytest.importorskip("peft")
    from bapsql.models.tiny import TinySpec, make_tiny_model

    out = tmp_path_factory.mktemp("tiny-pretrained")
    make_tiny_model(out, seed=0, pretrain_steps=150,
                    spec=TinySpec(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
                                  max_position_embeddings=2048))
    return out


@pytest.fixture()
def make_learner(tiny_model_dir):
    from bapsql.train.config import LearnerConfig, LoraSpec, OptimConfig
    from bapsql.train.learner.core import Learner

    def make(lr=1e-2, micro_batch_tokens=4096, rank=8, seed=0, model_path=None, optim=None, **kw):
        cfg = LearnerConfig(model_path=str(model_path or tiny_model_dir), lora=LoraSpec(rank=rank, alpha=2 * rank),
                            optim=optim or OptimConfig(lr=lr), micro_batch_tokens=micro_batch_tokens, dtype="float32",
                            device="cpu", threads=1, seed=seed, **kw)
        return Learner(cfg)

    return make
