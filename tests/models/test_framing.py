"""Chat framing measured from the template (bapsql/models/framing.py), and the invariant it exists for: the env's
live-context figure equals the token length of the prompt the agent really feeds the engine — for SmolLM2's ChatML,
a Qwen3-style template with thinking off, and Llama 3's headers (tests/models/chat_families.py)."""

from __future__ import annotations

import pytest

from bapsql.budgets import load_ladder
from bapsql.data.tasks import load_tasks
from bapsql.env.actions import EstimateQuery, ManageEvidence, render_action
from bapsql.env.episode import BudgetedSQLEnv
from bapsql.env.handles import DatabaseHandles
from bapsql.env.records import EnvOptions
from bapsql.errors import ChatTemplateError, ConfigError
from bapsql.models.chat_template import ChatTemplate
from bapsql.models.framing import DEFAULT_FRAMING, PROBES, ChatFraming
from bapsql.rollout.agent import AgentConfig, ModelAgent, completion_text
from bapsql.rollout.engines.base import Generation
from bapsql.tokens import DEFAULT_TOKENIZER_DIR, HFTokenCounter, RegexTokenCounter, load_token_counter
from tests.models.chat_families import END_OF_TURN, FAMILIES, RENDERS_SYSTEM_ALONE, make_family_dir
from tests.rollout.fakes import gold_plan
from tests.rollout.rollout_bench import build_rollout_bench

LADDER = load_ladder()
# family -> (overhead, generation prompt, trailer, past assistant overhead, conversation prefix)
EXPECTED = {
    "smollm2": ({"system": 5, "user": 5, "assistant": 5, "tool": 6}, 3, 2, 5, ""),  # "tool" is 2 tokens here
    "qwen3": ({"system": 5, "user": 5, "assistant": 9, "tool": 9}, 7, 2, 5, ""),  # + <think>\n\n</think>\n\n
    "qwen3_5": ({"system": 5, "user": 5, "assistant": 9, "tool": 9}, 7, 2, 9, ""),  # past turns keep the block
    "llama3": ({"system": 6, "user": 5, "assistant": 5, "tool": 6}, 4, 1, 5, "<|begin_of_text|>"),
}


@pytest.fixture(scope="module")
def families(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    return {f: make_family_dir(root, f) for f in FAMILIES}


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    return load_tasks(build_rollout_bench(tmp_path_factory.mktemp("bench")), "dev")


def _template(families, family) -> tuple[ChatTemplate, dict]:
    return ChatTemplate.from_dir(families[family]), FAMILIES[family]["kwargs"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_framing_values_are_measured_from_the_template(families, family):
    template, kwargs = _template(families, family)
    f = template.framing(**kwargs)
    overhead, gen, trailer, past, conversation = EXPECTED[family]
    assert (f.overhead, f.generation_prompt_tokens, f.trailer_tokens) == (overhead, gen, trailer)
    assert f.past_assistant_overhead == past and f.conversation_prefix == conversation
    assert f.end_of_turn_text == END_OF_TURN[family]
    eos = [template.tokenizer.token_to_id(t) for t in FAMILIES[family]["eos"]]
    assert f.end_of_turn_ids[0] == template.tokenizer.token_to_id(END_OF_TURN[family])
    assert set(f.end_of_turn_ids) == set(eos) | {f.end_of_turn_ids[0]}
    assert not f.charges_like(DEFAULT_FRAMING)  # the old ChatML constants would mis-charge every one of them
    assert template.framing(**kwargs) is f  # measured once per option set


def test_the_packaged_tokenizer_measures_to_the_default_and_the_default_is_qwen25_chatml():
    assert DEFAULT_FRAMING.overhead == {"system": 5, "user": 5, "assistant": 5, "tool": 9}
    assert (DEFAULT_FRAMING.generation_prompt_tokens, DEFAULT_FRAMING.trailer_tokens) == (3, 2)
    assert DEFAULT_FRAMING.end_of_turn_text == "<|im_end|>" and ChatFraming.default() == DEFAULT_FRAMING
    packaged = ChatTemplate.from_dir(DEFAULT_TOKENIZER_DIR).framing()
    assert packaged.charges_like(DEFAULT_FRAMING)
    assert packaged.role_prefix == DEFAULT_FRAMING.role_prefix and packaged.role_suffix == DEFAULT_FRAMING.role_suffix
    assert load_token_counter("default").framing.charges_like(DEFAULT_FRAMING)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_overheads_hold_for_real_contents_rendered_afresh(families, family, tasks):
    """Re-render the probes' roles with contents of a real episode: tokens(rendering) = contents + overheads."""
    template, kwargs = _template(families, family)
    f = template.framing(**kwargs)
    counter = HFTokenCounter(families[family], template_kwargs=kwargs)
    with DatabaseHandles(counter) as handles:
        env = BudgetedSQLEnv(token_counter=counter, handles=handles)
        env.reset(tasks[0], LADDER["M"])
        env.step(render_action(EstimateQuery(tasks[0].gold_sql)))
        env.step(gold_plan(tasks[0])[0])
        messages = env.messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool"]
    n = counter.count
    for k in (1, 2, 4, 6)[0 if RENDERS_SYSTEM_ALONE[family] else 1:]:  # ending with the system, user or a tool
        conv = messages[:k]
        charged = sum(n(m["content"]) + (f.past_assistant_overhead if m["role"] == "assistant" else
                                         f.overhead[m["role"]]) for m in conv)
        assert len(template.apply(conv, add_generation_prompt=True, **kwargs)) == charged + f.generation_prompt_tokens


def _play(folder, kwargs, task, level, condition="full", plan=None):
    """Play ``plan`` through a ModelAgent (completions fed as the model would sample them: text + end of turn) and
    return (tokens of the prompt the agent feeds the engine, the env's live context figure) at every turn."""
    template = ChatTemplate.from_dir(folder)
    counter = load_token_counter(str(folder), **kwargs)
    eot = template.framing(**kwargs).end_of_turn_text
    seen = []
    with DatabaseHandles(counter) as handles:
        env = BudgetedSQLEnv(token_counter=counter, handles=handles, options=EnvOptions().under(condition))
        agent = ModelAgent(env, template, AgentConfig(str(folder), max_tokens=4096, template_kwargs=kwargs),
                           episode_key=task.task_id, seed=0)
        agent.reset(task, LADDER[level])
        for text in plan:
            if agent.done:
                break
            req = agent.request()
            ctx = agent.info["ledger"]["spent"]["context_tokens"]
            headroom = agent.info["max_completion_tokens"]
            seen.append((len(req.prompt_ids), ctx))
            assert len(req.prompt_ids) + headroom + env.framing.trailer_tokens == LADDER[level].context_tokens
            ids = tuple(template.encode(text + eot))
            assert completion_text(template, ids, agent.framing) == text
            agent.advance(Generation(req.prompt_ids, ids, text, None, "stop"))
        rewrites = len(agent.segments())
    return seen, rewrites


def _plan(task):
    execute, answer = gold_plan(task)
    return ["I will look first.", render_action(EstimateQuery(task.gold_sql)), execute,
            render_action(ManageEvidence("compress", "E1")), render_action(ManageEvidence("restore", "E1")), answer]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("level,condition", [("L", "full"), ("S", "full"), ("M", "raw")])
def test_the_live_context_is_the_prompt_the_agent_feeds_the_engine(families, tasks, family, level, condition):
    """The invariant: at every turn the env's context figure equals the token length of the agent's prompt —
    through an invalid action, an estimate, an execution, evidence compression (a fresh rendering) and a restore."""
    kwargs = FAMILIES[family]["kwargs"]
    for task in tasks[::3]:
        seen, segments = _play(families[family], kwargs, task, level, condition, _plan(task))
        assert len(seen) >= 4 and all(prompt == ctx for prompt, ctx in seen), (task.task_id, seen)
        if condition == "full" and level == "L":
            assert segments >= 2  # the compression started a freshly rendered segment


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_completion_text_strips_the_templates_end_of_turn_only(families, family):
    template, kwargs = _template(families, family)
    f = template.framing(**kwargs)
    body = '<tool_call>\n{"name": "abstain", "arguments": {"reason": "x"}}\n</tool_call>'
    for end in f.end_of_turn_texts:  # the turn-closing token, or any eos the model stops on
        assert completion_text(template, template.encode(body + end), f) == body
    assert completion_text(template, template.encode(body), f) == body  # a length-capped completion
    if family == "llama3":  # the old hard-coded ChatML tokens are no end of turn for Llama 3
        assert f.end_of_turn_texts == ("<|eot_id|>", "<|end_of_text|>")
        assert completion_text(template, template.encode(body + "<|eot_id|>")) == body


def test_counters_carry_their_framing(families, tmp_path):
    assert RegexTokenCounter().framing is DEFAULT_FRAMING
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "tokenizer.json").write_bytes((DEFAULT_TOKENIZER_DIR / "tokenizer.json").read_bytes())
    assert HFTokenCounter(bare).framing is DEFAULT_FRAMING  # no chat template next to the tokenizer
    qwen3 = families["qwen3"]
    assert load_token_counter(str(qwen3)).framing.generation_prompt_tokens == 3  # thinking not switched off
    off = load_token_counter(str(qwen3), enable_thinking=False)
    assert off.framing.generation_prompt_tokens == 7 and off is load_token_counter(str(qwen3), enable_thinking=False)
    llama = HFTokenCounter(families["llama3"] / "tokenizer.json")  # a tokenizer file: its folder's template
    assert llama.framing.charges_like(ChatTemplate.from_dir(families["llama3"]).framing())
    assert llama.framing is HFTokenCounter(families["llama3"]).framing  # measured once per folder


def test_the_agent_refuses_an_env_that_charges_another_framing(families, tasks):
    folder = families["llama3"]
    with DatabaseHandles(load_token_counter("default")) as handles:
        env = BudgetedSQLEnv(token_counter=handles.token_counter, handles=handles)
        with pytest.raises(ConfigError, match="load_token_counter"):
            ModelAgent(env, ChatTemplate.from_dir(folder), AgentConfig(str(folder)), episode_key="e", seed=0)


def _folder_with_template(families, tmp_path, template: str):
    import shutil

    folder = tmp_path / "custom"
    shutil.copytree(families["smollm2"], folder)
    (folder / "chat_template.jinja").write_text(template)
    return ChatTemplate.from_dir(folder)


def test_a_template_that_cannot_render_a_tool_message_names_the_role(families, tmp_path):
    strict = ("{%- for m in messages %}{%- if m.role not in ['system', 'user', 'assistant'] %}"
              "{{ raise_exception('Only user, assistant and system roles are supported') }}{%- endif %}"
              "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endfor %}"
              "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    with pytest.raises(ChatTemplateError, match="'tool' message.*chat_template.jinja"):
        _folder_with_template(families, tmp_path, strict).framing()


def test_a_template_that_drops_content_is_refused(families, tmp_path):
    lossy = ("{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content[:3] + '<|im_end|>\\n' }}"
             "{%- endfor %}{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
    with pytest.raises(ChatTemplateError, match="verbatim"):
        _folder_with_template(families, tmp_path, lossy).framing()


def test_probe_contents_tokenize_alike_alone_and_in_context(families):
    """The probes are letter runs: their tokens inside each family's rendering are their tokens alone."""
    for family in FAMILIES:
        template, kwargs = _template(families, family)
        for role, content in PROBES.items():
            messages = [{"role": "system", "content": PROBES["system"]}] + (
                [] if role == "system" else [{"role": role, "content": content}])
            if not RENDERS_SYSTEM_ALONE[family] and role != "user":  # Qwen3.5 renders no conversation without one
                messages.insert(1, {"role": "user", "content": PROBES["user"]})
            ids = template.apply(messages, **kwargs)
            alone = template.encode(content)
            assert any(ids[i:i + len(alone)] == alone for i in range(len(ids))), (family, role)


@pytest.mark.slow
def test_the_real_smollm2_folder(smollm2_dir, tasks):
    """SmolLM2-135M-Instruct's own tokenizer and template: 'assistant' is two tokens, its tool turn is plain."""
    template = ChatTemplate.from_dir(smollm2_dir)
    f = template.framing()
    assert f.overhead == {"system": 5, "user": 5, "assistant": 6, "tool": 5}
    assert (f.generation_prompt_tokens, f.trailer_tokens, f.end_of_turn_text) == (4, 2, "<|im_end|>")
    assert f.end_of_turn_ids == (template.tokenizer.token_to_id("<|im_end|>"),)
    for task in tasks[:4]:
        seen, _ = _play(smollm2_dir, {}, task, "L", plan=_plan(task))
        assert all(prompt == ctx for prompt, ctx in seen), (task.task_id, seen)
