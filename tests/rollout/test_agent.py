"""The model-driven policy: token-in/token-out segments, requests capped by the env, batching across episodes.

Fast tests use `tests.rollout.fakes.PlanEngine` (scripted completions through the real tokenizer, env and chat
template); the slow test at the end drives the same loop with the real HF engine on the tiny model.
"""

from __future__ import annotations

import pytest

from bapsql.budgets import load_ladder
from bapsql.data.tasks import load_tasks
from bapsql.env.actions import ManageEvidence, render_action
from bapsql.env.episode import BudgetedSQLEnv
from bapsql.env.handles import DatabaseHandles
from bapsql.errors import ConfigError, EnvStateError
from bapsql.rollout.agent import AgentConfig, ModelAgent, completion_text, load_template, run_agents, turn_seed
from bapsql.tokens import DEFAULT_TOKENIZER_DIR, load_token_counter
from tests.rollout.fakes import FALLBACK, PlanEngine, gold_plan
from tests.rollout.rollout_bench import build_rollout_bench

LADDER = load_ladder()


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return load_tasks(build_rollout_bench(tmp_path_factory.mktemp("bench")), "dev")


@pytest.fixture(scope="module")
def handles():
    h = DatabaseHandles(load_token_counter("default"))
    yield h
    h.close()


@pytest.fixture(scope="module")
def template():
    return load_template(DEFAULT_TOKENIZER_DIR)


def _agent(handles, template, task, level="M", seed=0, **cfg):
    env = BudgetedSQLEnv(token_counter=handles.token_counter, handles=handles)
    agent = ModelAgent(env, template, AgentConfig(str(DEFAULT_TOKENIZER_DIR), **cfg), episode_key=task.task_id,
                       seed=seed)
    agent.reset(task, LADDER[level])
    return agent


def test_a_model_episode_is_one_token_sequence_with_masks_on_sampled_tokens(handles, template, tasks):
    task = tasks[0]
    engine = PlanEngine({task.question: gold_plan(task)})
    agent = _agent(handles, template, task)
    first = template.apply(agent.env.messages, add_generation_prompt=True)
    prompts = []
    while not agent.done:
        req = agent.request()
        prompts.append(req.prompt_ids)
        agent.advance(engine.generate([req.prompt_ids], [req.params])[0])
    summary = agent.env.summary()
    assert summary.success and summary.turns == 2 and summary.invalid_actions == 0
    (seg,) = agent.segments()
    assert list(seg.input_ids[:len(first)]) == first  # rendered once, then only appended to
    assert all(seg.input_ids[:len(p)] == p for p in prompts)  # each prompt is a prefix of the final sequence
    sampled = [t for t, m in zip(seg.input_ids, seg.loss_mask) if m]
    assert template.decode(sampled) == "".join(c + "<|im_end|>" for c in gold_plan(task))
    assert all((lp < 0) == bool(m) for lp, m in zip(seg.logprobs, seg.loss_mask))
    assert agent.completions == gold_plan(task)
    assert agent.generated_tokens == sum(seg.loss_mask)


def test_rerunning_an_episode_with_its_seed_reproduces_it_exactly(handles, template, tasks):
    task = tasks[1]
    engine = PlanEngine({task.question: gold_plan(task)})
    runs = []
    for _ in range(2):
        agent = _agent(handles, template, task, seed=11)
        run_agents([agent], engine)
        runs.append(agent.segments())
    assert runs[0] == runs[1]
    assert turn_seed(11, 0) != turn_seed(11, 1) and turn_seed(11, 0) != turn_seed(12, 0)


def test_requests_join_the_running_batch_as_soon_as_their_episode_is_ready(handles, template, tasks):
    plans = {t.question: gold_plan(t) for t in tasks[:6]}
    plans[tasks[5].question] = plans[tasks[5].question][:1] + [FALLBACK, plans[tasks[5].question][1]]
    engine = PlanEngine(plans)
    agents = [_agent(handles, template, t) for t in tasks[:6]]
    generated = run_agents(agents, engine)
    assert engine.calls == []  # no synchronous rounds: everything goes through step()
    assert engine.steps[0] == (6, 6)  # every episode's first request in one batch
    # continuous batching: later requests join while earlier ones are still decoding
    assert any(0 < admitted < decoding for admitted, decoding in engine.steps[1:])
    assert sum(admitted for admitted, _ in engine.steps) == 6 * 2 + 1  # one request per turn, none repeated
    assert engine.in_flight() == 0
    assert generated == sum(a.generated_tokens for a in agents)
    assert all(a.done for a in agents)
    assert agents[5].env.summary().invalid_actions == 1


def test_completions_are_capped_by_the_context_headroom_and_the_model_length(handles, template, tasks):
    agent = _agent(handles, template, tasks[0], level="XS", max_tokens=10_000)
    req = agent.request()
    assert req.params.max_tokens == agent.info["max_completion_tokens"] < 10_000
    n = len(_agent(handles, template, tasks[0], level="L").request().prompt_ids)
    agent = _agent(handles, template, tasks[0], level="L", max_tokens=10_000, max_model_len=2 * n)
    req = agent.request()  # the window (2n) leaves at most n tokens after the prompt
    assert req.params.max_tokens == agent.info["max_completion_tokens"] and n - 80 < req.params.max_tokens <= n


def test_a_model_window_below_the_budget_caps_the_live_context(handles, template, tasks):
    """L allows 11,000 context tokens; a model holding n + 100 + margin plays L with n + 100: the env's own
    accounting (headroom, dashboard, truncation) then keeps every prompt and completion inside the window."""
    from bapsql.experiment import MODEL_LEN_MARGIN
    from bapsql.rollout.agent import window_budget

    n = len(_agent(handles, template, tasks[0], level="L").request().prompt_ids)
    window = n + 100 + MODEL_LEN_MARGIN
    agent = _agent(handles, template, tasks[0], level="L", max_tokens=10_000, max_model_len=window)
    assert agent.env.ledger.budget.context_tokens == n + 100 and agent.env.ledger.budget.level == "L"
    req = agent.request()
    assert 0 < req.params.max_tokens == agent.info["max_completion_tokens"] < 120
    assert len(req.prompt_ids) + req.params.max_tokens <= window
    budget = agent.env.ledger.budget
    assert window_budget(budget, None) is budget and window_budget(budget, 10**6) is budget


def test_a_length_capped_completion_is_an_invalid_action_and_still_token_exact(handles, template, tasks):
    task = tasks[0]
    engine = PlanEngine({task.question: gold_plan(task)})
    agent = _agent(handles, template, task, max_tokens=5)
    req = agent.request()
    gen = engine.generate([req.prompt_ids], [req.params])[0]
    assert gen.finish_reason == "length" and len(gen.completion_ids) == 5
    agent.advance(gen)
    assert agent.info["valid"] is False and not agent.done
    (seg,) = agent.segments()
    assert [t for t, m in zip(seg.input_ids, seg.loss_mask) if m] == list(gen.completion_ids)
    assert agent.request().prompt_ids[:len(req.prompt_ids) + 5] == req.prompt_ids + gen.completion_ids


def test_evidence_management_starts_a_new_segment(handles, template, tasks):
    task = tasks[0]
    plan = gold_plan(task)
    engine = PlanEngine({task.question: [plan[0], render_action(ManageEvidence("compress", "E1")), plan[1]]})
    agent = _agent(handles, template, task, level="L")
    run_agents([agent], engine)
    segs = agent.segments()
    assert len(segs) == 2 and agent.env.summary().turns == 3
    assert sum(sum(s.loss_mask) for s in segs) == agent.generated_tokens
    # the new segment is a fresh rendering of the conversation the env shows now (without the last completion)
    fresh = template.decode(segs[1].input_ids[:len(segs[1].input_ids) - sum(segs[1].loss_mask)])
    assert fresh.endswith("<|im_start|>assistant\n")


def test_completion_text_drops_end_of_turn_tokens_only(template):
    ids = template.encode('<tool_call>\n{"name": "abstain", "arguments": {"reason": "x"}}\n</tool_call><|im_end|>')
    assert completion_text(template, ids).endswith("</tool_call>")
    assert "<tool_call>" in completion_text(template, ids)


def test_bad_use_and_bad_config(handles, template, tasks):
    env = BudgetedSQLEnv(token_counter=handles.token_counter, handles=handles)
    agent = ModelAgent(env, template, AgentConfig(str(DEFAULT_TOKENIZER_DIR)), episode_key="x", seed=0)
    with pytest.raises(EnvStateError):
        agent.request()
    for bad in ({"max_tokens": 0}, {"temperature": -1.0}, {"top_p": 0.0}):
        with pytest.raises(ConfigError):
            AgentConfig("m", **bad)


@pytest.mark.slow
def test_the_agent_loop_runs_on_the_real_hf_engine_with_the_tiny_model(handles, template, tasks, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from bapsql.rollout.engines.base import EngineConfig
    from bapsql.rollout.engines.factory import make_engine
    from bapsql.models.tiny import make_tiny_model

    model = tmp_path / "tiny"
    make_tiny_model(model, seed=0)
    engine = make_engine(EngineConfig(kind="hf", model=str(model)))
    try:
        tpl = load_template(model)
        agents = []
        for i, t in enumerate(tasks[:3]):
            env = BudgetedSQLEnv(token_counter=handles.token_counter, handles=handles)
            a = ModelAgent(env, tpl, AgentConfig(str(model), max_tokens=24, temperature=1.0), episode_key=t.task_id,
                           seed=i)
            a.reset(t, LADDER["XS"])
            agents.append(a)
        generated = run_agents(agents, engine)
    finally:
        engine.close()
    assert generated > 0 and all(a.done for a in agents)
    for a in agents:
        segs = a.segments()
        assert sum(sum(s.loss_mask) for s in segs) == a.generated_tokens
        assert all(s.logprobs is not None for s in segs)
        assert a.env.summary().turns >= 1
