"""The scheduler in front of a local engine (bapsql/rollout/engines/batching.py): one thread owns the engine and runs
every caller's request in one batch; withdrawn requests are aborted; a request that does not fit fails alone; engine
death fails what is in flight, and health says so until a restart. Fast tests use scripted engines; the slow ones
run SmolLM2-135M-Instruct on the real HF and vLLM engines."""

from __future__ import annotations

import importlib.util
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from bapsql.errors import EngineDead, EngineError
from bapsql.rollout.engines.base import EngineConfig, Generation, RoundBatching, SamplingParams
from bapsql.rollout.engines.batching import BatchScheduler, PooledTurns, turn_source
from tests.serve.local_engine import EngineDeadError, StepEngine

SP = SamplingParams(max_tokens=8, temperature=0.0)


class RoundEngine(RoundBatching):
    """HF-shaped: whole batches through ``generate`` (completion = the prompt reversed); records batch sizes and the
    threads that called it."""

    name = "round-fake"

    def __init__(self, delay_s: float = 0.05):
        self.config = EngineConfig(kind="hf", model="round-fake", max_model_len=64)
        self.delay_s, self.calls, self.threads, self.closed = delay_s, [], set(), False

    def generate(self, prompts, params, *, adapter=None):
        self.threads.add(threading.get_ident())
        self.calls.append(len(prompts))
        time.sleep(self.delay_s)
        return [Generation(tuple(p), tuple(reversed(p)), "", None, "stop") for p in prompts]

    def close(self):
        self.closed = True


def test_requests_from_many_threads_run_in_shared_batches_on_one_thread():
    engine = RoundEngine()
    sched = BatchScheduler(engine)
    try:
        with ThreadPoolExecutor(8) as pool:
            outs = list(pool.map(lambda i: sched.submit([i, i + 1, i + 2], SP).result(10), range(24)))
    finally:
        sched.close()
    assert [g.completion_ids for g in outs] == [(i + 2, i + 1, i) for i in range(24)]  # each asker gets its own
    assert len(engine.threads) == 1 and sum(engine.calls) == 24 and max(engine.calls) > 1
    assert sched.peak_batch == max(engine.calls) and engine.closed


def test_a_withdrawn_request_is_aborted_and_a_prompt_too_long_fails_alone():
    engine = StepEngine({}, hold_from_turn=0)  # requests never finish until released
    sched = BatchScheduler(engine)
    try:
        prompt = engine._plan.template.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        kept, dropped = sched.submit(prompt, SP), sched.submit(prompt, SP)
        deadline = time.monotonic() + 10
        while engine.in_flight() < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert dropped.cancel()
        while not engine.aborted and time.monotonic() < deadline:
            time.sleep(0.01)
        assert engine.aborted == ["turn-1"] and engine.in_flight() == 1
        too_long = sched.submit(list(range(40_000)), SP)
        with pytest.raises(EngineError, match="max_model_len|context|exceeds"):
            too_long.result(5)
        engine.release()
        assert kept.result(10).completion_ids  # the others were not disturbed
        assert sched.health().ok
    finally:
        engine.release()
        sched.close()


@pytest.mark.parametrize("restart", [False, True])
def test_engine_death_fails_what_is_in_flight_and_health_says_why_until_a_restart(restart):
    engine = StepEngine({}, hold_from_turn=0)
    fresh = RoundEngine(delay_s=0.0)
    sched = BatchScheduler(engine, restart=(lambda: fresh) if restart else None, restart_backoff_s=0.01)
    try:
        prompt = engine._plan.template.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        running = sched.submit(prompt, SP)
        engine.kill(EngineDeadError())
        with pytest.raises(EngineDead, match="EngineDeadError: EngineCore encountered an issue"):
            running.result(10)
        assert engine.closed
        if not restart:
            health = sched.health()
            assert health.state == "dead" and "EngineDeadError" in health.reason and not health.ok
            with pytest.raises(EngineDead, match="not restarted"):
                sched.submit(prompt, SP)
        else:
            deadline = time.monotonic() + 10
            while not sched.health().ok and time.monotonic() < deadline:
                time.sleep(0.01)
            assert sched.health().restarts == 1 and sched.engine is fresh
            assert sched.submit([1, 2, 3], SP).result(10).completion_ids == (3, 2, 1)
    finally:
        sched.close()
    assert fresh.closed == restart


def test_a_death_the_engine_reports_wakes_a_blocked_step_and_is_seen_while_idle():
    """vLLM's engine-core process gone: its step blocks for good and only ``dead_reason`` tells; the watchdog asks."""
    engine = StepEngine({}, hold_from_turn=0)
    sched = BatchScheduler(engine, watch_s=0.05)
    try:
        prompt = engine._plan.template.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
        running = sched.submit(prompt, SP)
        engine.kill_core()
        with pytest.raises(EngineDead, match="EngineDeadError"):
            running.result(10)
        assert sched.health().state == "dead"
    finally:
        sched.close()
    idle_engine = StepEngine({})
    idle = BatchScheduler(idle_engine, watch_s=0.05)
    try:
        idle_engine.kill_core()  # nothing in flight: health must turn without any request
        deadline = time.monotonic() + 10
        while idle.health().ok and time.monotonic() < deadline:
            time.sleep(0.01)
        assert idle.health().state == "dead" and "engine core process exited" in idle.health().reason
        assert idle_engine.closed
    finally:
        idle.close()


def test_http_engines_keep_their_pool_and_the_source_is_picked_by_kind():
    engine = RoundEngine(delay_s=0.01)
    turns = turn_source(engine, "openai_chat", workers=4)
    try:
        assert isinstance(turns, PooledTurns) and turns.health().ok
        with ThreadPoolExecutor(4) as pool:
            outs = list(pool.map(lambda i: turns.submit([i, 7], SP).result(10), range(8)))
        assert [g.completion_ids for g in outs] == [(7, i) for i in range(8)] and len(engine.threads) > 1
    finally:
        turns.close()
    assert not engine.closed  # an HTTP engine is its caller's
    local = turn_source(RoundEngine(), "hf", workers=4)
    assert isinstance(local, BatchScheduler)
    local.close()


def _prompts(smollm2_dir, n):
    from bapsql.models.chat_template import ChatTemplate

    t = ChatTemplate.from_dir(smollm2_dir)
    return [t.apply([{"role": "user", "content": f"Count to {i + 3}."}], add_generation_prompt=True)
            for i in range(n)]


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch not installed")
def test_the_hf_engine_batches_concurrent_askers_with_the_same_greedy_completions(smollm2_dir):
    from bapsql.rollout.engines.hf import HFEngine

    engine = HFEngine(EngineConfig(kind="hf", model=str(smollm2_dir), max_model_len=2048, max_num_seqs=8))
    prompts = _prompts(smollm2_dir, 4)
    alone = [engine.generate([p], [SP])[0] for p in prompts]
    calls = []
    generate = engine.generate
    engine.generate = lambda ps, sps, **kw: calls.append(len(ps)) or generate(ps, sps, **kw)
    sched = BatchScheduler(engine)
    try:
        with ThreadPoolExecutor(4) as pool:
            batched = list(pool.map(lambda p: sched.submit(p, SP).result(300), prompts))
    finally:
        sched.close()
    assert [g.completion_ids for g in batched] == [g.completion_ids for g in alone]
    assert sum(calls) == 4 and max(calls) > 1


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm not installed")
def test_the_vllm_engine_admits_askers_between_steps_and_aborts_withdrawn_ones(smollm2_dir):
    from bapsql.rollout.engines.vllm import VLLMEngine

    engine = VLLMEngine(EngineConfig(kind="vllm", model=str(smollm2_dir), max_model_len=2048, max_num_seqs=8,
                                     kv_cache_space_gb=1, enforce_eager=True))
    prompts = _prompts(smollm2_dir, 4)
    alone = engine.generate(prompts, [SP] * 4)
    sched = BatchScheduler(engine)
    try:
        long = sched.submit(prompts[0], SamplingParams(max_tokens=400, temperature=1.0, seed=1))
        with ThreadPoolExecutor(4) as pool:
            batched = list(pool.map(lambda p: sched.submit(p, SP).result(300), prompts))
        assert not long.done()  # the short ones joined the long one's batch and finished first
        assert long.cancel()
        deadline = time.monotonic() + 60
        while engine.in_flight() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert engine.in_flight() == 0 and sched.health().ok  # withdrawn: aborted in vLLM
    finally:
        sched.close()
    assert [g.completion_ids for g in batched] == [g.completion_ids for g in alone]
    assert sched.peak_batch >= 2
