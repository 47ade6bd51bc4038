"""The transformers reference engine on the tiny model: greedy determinism, padding-invariance, per-request seeds,
stop handling, logprobs, and peft adapter hot swap."""

from __future__ import annotations

import math
import shutil

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from bapsql.errors import EngineError  # noqa: E402
from bapsql.rollout.engines.base import (AdapterRef, Engine, EngineConfig, SamplingParams,  # noqa: E402
                                         adapter_digest)
from bapsql.rollout.engines.codec import ModelCodec  # noqa: E402
from bapsql.rollout.engines.factory import make_engine  # noqa: E402
from bapsql.models.tiny import make_tiny_model  # noqa: E402
from tests.rollout.engine_helpers import add_eos, prompt_ids, write_lora  # noqa: E402

pytestmark = pytest.mark.slow  # builds and runs the tiny model (seconds)

GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0).out_dir


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = make_engine(EngineConfig(kind="hf", model=str(model_dir), max_model_len=512, num_threads=1))
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def prompts(model_dir):
    return prompt_ids(model_dir)


def test_is_an_engine_returning_token_ids_text_and_logprobs(engine, prompts):
    assert isinstance(engine, Engine) and engine.name == "hf"
    [g] = engine.generate(prompts[:1], [GREEDY])
    assert g.prompt_ids == tuple(prompts[0]) and len(g.completion_ids) == 12 and g.finish_reason == "length"
    assert len(g.logprobs) == 12 and all(lp <= 0 and math.isfinite(lp) for lp in g.logprobs)
    assert isinstance(g.text, str) and g.text


def test_greedy_is_deterministic_and_independent_of_batch_padding(engine, prompts):
    batch = engine.generate(prompts, [GREEDY] * len(prompts))
    assert len({len(p) for p in prompts}) > 1  # the batch really is left-padded
    again = engine.generate(prompts, [GREEDY] * len(prompts))
    alone = [engine.generate([p], [GREEDY])[0] for p in prompts]
    assert [g.completion_ids for g in batch] == [g.completion_ids for g in again] == [g.completion_ids for g in alone]
    for b, a in zip(batch, alone):
        assert max(abs(x - y) for x, y in zip(b.logprobs, a.logprobs)) < 1e-4


def test_logprobs_are_those_of_the_distribution_sampled_from(engine, prompts):
    """Greedy and T = 1 report the raw logprobs; T = 0.7 those of logits / 0.7 (checked exactly against the learner
    in tests/train/learner/test_learner_cluster.py); top-p renormalises over the nucleus (never below the full one)."""
    t1 = SamplingParams(max_tokens=10, temperature=1.0, top_p=1.0, seed=5)
    for g in engine.generate(prompts[:2], [GREEDY, t1]):
        scored = engine.logprobs_of(g.prompt_ids, g.completion_ids)
        assert max(abs(x - y) for x, y in zip(g.logprobs, scored)) < 1e-4
    cold = engine.generate(prompts[:1], [SamplingParams(max_tokens=10, temperature=0.7, top_p=1.0, seed=5)])[0]
    scored = engine.logprobs_of(cold.prompt_ids, cold.completion_ids)
    assert max(abs(x - y) for x, y in zip(cold.logprobs, scored)) > 1e-3
    nucleus = engine.generate(prompts[:1], [SamplingParams(max_tokens=10, temperature=1.0, top_p=0.9, seed=5)])[0]
    scored = engine.logprobs_of(nucleus.prompt_ids, nucleus.completion_ids)
    assert all(x >= y - 1e-5 for x, y in zip(nucleus.logprobs, scored))


def test_per_request_seeds_reproduce_whatever_the_batch(engine, prompts):
    def sp(seed):
        return SamplingParams(max_tokens=16, temperature=1.0, seed=seed)

    alone = engine.generate([prompts[1]], [sp(11)])[0]
    mixed = engine.generate(prompts, [sp(3), sp(11), sp(4), SamplingParams(max_tokens=16)])
    assert mixed[1].completion_ids == alone.completion_ids
    other = engine.generate([prompts[1]], [sp(12)])[0]
    assert other.completion_ids != alone.completion_ids


def test_tiny_top_p_is_greedy_and_logprobs_can_be_omitted(engine, prompts):
    greedy = engine.generate(prompts[:1], [GREEDY])[0]
    nucleus = engine.generate(prompts[:1], [SamplingParams(max_tokens=12, top_p=1e-6, seed=1, logprobs=False)])[0]
    assert nucleus.completion_ids == greedy.completion_ids and nucleus.logprobs is None


def test_stop_string_cuts_the_text_and_keeps_the_sampled_tokens(engine, model_dir, prompts):
    full = engine.generate(prompts[:1], [GREEDY])[0]
    codec = ModelCodec.from_dir(model_dir)
    codec_text = [codec.decode(full.completion_ids[:k]) for k in range(1, 13)]
    # the first prefix whose text grew: use its new tail as the stop string
    k = next(i for i in range(4, 12) if len(codec_text[i]) > len(codec_text[i - 1]) and codec_text[i][-1].strip())
    stop = codec_text[k][len(codec_text[k - 1]):]
    first = next(i for i in range(len(codec_text)) if stop in codec_text[i])
    g = engine.generate(prompts[:1], [SamplingParams(max_tokens=12, temperature=0.0, stop=(stop,))])[0]
    assert g.finish_reason == "stop"
    assert g.completion_ids == full.completion_ids[:first + 1]
    assert g.text == codec_text[first][:codec_text[first].find(stop)]


def test_eos_ends_the_completion_and_is_kept(tmp_path, engine, model_dir, prompts):
    full = engine.generate(prompts[:1], [GREEDY])[0]
    # make the last token that first appears at its position an end-of-sequence token
    eos_at = max(i for i in range(12) if full.completion_ids[i] not in full.completion_ids[:i])
    token = full.completion_ids[eos_at]
    copy = tmp_path / "model"
    shutil.copytree(model_dir, copy)
    add_eos(copy, token)
    eng = make_engine(EngineConfig(kind="hf", model=str(copy), max_model_len=512))
    try:
        g = eng.generate(prompts[:1], [GREEDY])[0]
    finally:
        eng.close()
    assert g.finish_reason == "stop" and g.completion_ids == full.completion_ids[:eos_at + 1]
    assert g.text == ModelCodec.from_dir(model_dir).decode(full.completion_ids[:eos_at])  # no eos text, as vLLM


def test_bad_batches_and_closed_engines_raise(model_dir, prompts):
    eng = make_engine(EngineConfig(kind="hf", model=str(model_dir), max_model_len=64))
    with pytest.raises(EngineError, match="one per prompt"):
        eng.generate(prompts[:2], [GREEDY])
    with pytest.raises(EngineError, match="max_model_len"):
        eng.generate([list(range(60))], [GREEDY])
    with pytest.raises(EngineError, match="not loaded"):
        eng.generate(prompts[:1], [GREEDY], adapter=AdapterRef("ghost", 1, "/nowhere", 1))
    eng.close()
    eng.close()  # idempotent
    with pytest.raises(EngineError, match="after close"):
        eng.generate(prompts[:1], [GREEDY])


def test_not_a_model_folder_is_an_engine_error(tmp_path):
    with pytest.raises(EngineError, match="not a model folder"):
        make_engine({"kind": "hf", "model": str(tmp_path)})


@pytest.mark.slow  # importing peft alone takes ~10 s here
def test_lora_adapter_hot_swap(tmp_path, engine, model_dir, prompts):
    peft = pytest.importorskip("peft")
    import torch
    from transformers import AutoModelForCausalLM

    adapter_dir = tmp_path / "adapter"
    base = engine.generate(prompts[:2], [GREEDY] * 2)
    write_lora(model_dir, adapter_dir, seed=1)
    v1 = engine.load_adapter(str(adapter_dir), "policy", 1)
    assert (v1.name, v1.version, v1.lora_id) == ("policy", 1, 1)
    with_v1 = engine.generate(prompts[:2], [GREEDY] * 2, adapter=v1)
    assert [g.logprobs for g in with_v1] != [g.logprobs for g in base]
    # no adapter still means the base model
    assert [g.completion_ids for g in engine.generate(prompts[:2], [GREEDY] * 2)] == [g.completion_ids for g in base]

    # the engine's adapter logprobs equal an independent peft model's
    ref = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter_dir).eval()
    ids = list(with_v1[0].prompt_ids) + list(with_v1[0].completion_ids)
    with torch.no_grad():
        logits = ref(input_ids=torch.tensor([ids])).logits[0]
    n = len(with_v1[0].prompt_ids)
    expect = torch.log_softmax(logits[n - 1:-1], -1).gather(1, torch.tensor(with_v1[0].completion_ids)[:, None])[:, 0]
    assert max(abs(a - b) for a, b in zip(with_v1[0].logprobs, expect.tolist())) < 1e-4

    # overwrite the same folder with new weights and reload in place
    write_lora(model_dir, adapter_dir, seed=2)
    v2 = engine.load_adapter(str(adapter_dir), "policy", 2)
    assert v2.lora_id == v1.lora_id and v2.version == 2
    # what it serves is reported by identity: the version and the digest of the files it read
    assert engine.served_adapter(v2) == v2 and v2.digest == adapter_digest(adapter_dir) != v1.digest
    assert engine.served_adapter(None) is None
    with_v2 = engine.generate(prompts[:2], [GREEDY] * 2, adapter=v2)
    assert [g.logprobs for g in with_v2] != [g.logprobs for g in with_v1]
    scored = engine.logprobs_of(with_v1[0].prompt_ids, with_v1[0].completion_ids, adapter=v2)
    assert max(abs(a - b) for a, b in zip(scored, with_v1[0].logprobs)) > 1e-3
    with pytest.raises(EngineError, match="replaced"):
        engine.generate(prompts[:1], [GREEDY], adapter=v1)
    with pytest.raises(EngineError, match="adapter_config"):
        engine.load_adapter(str(tmp_path / "missing"), "policy", 3)


def test_step_runs_what_is_in_flight_as_one_round_with_generates_results(engine, prompts):
    params = [GREEDY, SamplingParams(max_tokens=16, temperature=1.0, seed=11)]
    direct = engine.generate(prompts[:2], params)
    done = engine.step([("a", prompts[0], params[0]), ("b", prompts[1], params[1])])
    assert [k for k, _ in done] == ["a", "b"] and engine.in_flight() == 0  # round batching: all finish
    assert [g.completion_ids for _, g in done] == [g.completion_ids for g in direct]
    assert engine.step([]) == []
    with pytest.raises(EngineError, match="already in flight"):
        engine.step([("a", prompts[0], GREEDY), ("a", prompts[1], GREEDY)])
