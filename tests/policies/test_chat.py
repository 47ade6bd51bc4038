"""Chat rendering with a folder's own template and token-in/token-out segments (bapsql/policies/chat.py)."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bapsql.errors import ChatTemplateError, ConfigError, EngineError
from bapsql.models.chat_template import ChatTemplate
from bapsql.policies.chat import Segment, TokenTrajectory, TurnTokens
from bapsql.tokens import DEFAULT_TOKENIZER_DIR
from tests.policies.templates import QWEN3_WITH_CHECKS

TOOLS = [
    {"type": "function", "function": {"name": "execute_query", "description": "Run one read-only SQL query.",
                                      "parameters": {"type": "object", "properties": {"sql": {"type": "string"}},
                                                     "required": ["sql"]}}},
    {"type": "function", "function": {"name": "answer", "description": "Give the final answer.",
                                      "parameters": {"type": "object", "properties": {"values": {"type": "array"}}}}},
]
SYSTEM = {"role": "system", "content": "You answer questions over a SQLite database within a budget."}
USER = {"role": "user", "content": "How many singers are from France?"}
CALL = '<tool_call>\n{"name": "execute_query", "arguments": {"sql": "SELECT COUNT(*) FROM singer"}}\n</tool_call>'
STRUCTURED_CALL = {"role": "assistant", "content": "", "tool_calls": [
    {"type": "function", "function": {"name": "execute_query", "arguments": {"sql": "SELECT COUNT(*) FROM singer"}}}]}


@pytest.fixture(scope="module")
def ct() -> ChatTemplate:
    return ChatTemplate.from_dir(DEFAULT_TOKENIZER_DIR)


def conversations():
    """(name, messages, tools) cases covering system/no system, tools, tool_calls, grouped tool messages."""
    tool = {"role": "tool", "content": '{"ref": "E1", "columns": ["n"], "rows": [[3]]}'}
    return [
        ("plain", [USER], None),
        ("system", [SYSTEM, USER], None),
        ("tools", [SYSTEM, USER], TOOLS),
        ("tools-no-system", [USER], TOOLS),
        ("tool-calls", [SYSTEM, USER, STRUCTURED_CALL, tool], TOOLS),
        ("text-call", [SYSTEM, USER, {"role": "assistant", "content": CALL}, tool, tool,
                       {"role": "assistant", "content": "It is 3."}], TOOLS),
        ("string-arguments", [USER, {"role": "assistant", "content": None, "tool_calls": [
            {"function": {"name": "answer", "arguments": '{"values": [3]}'}}]}], TOOLS),
    ]


@pytest.mark.slow  # importing transformers (with torch installed) takes ~10 s
@pytest.mark.parametrize("gen", [True, False])
@pytest.mark.parametrize("case", conversations(), ids=lambda c: c[0])
def test_render_matches_transformers_apply_chat_template(ct, case, gen):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(DEFAULT_TOKENIZER_DIR))
    _, messages, tools = case
    text = ct.render(messages, tools=tools, add_generation_prompt=gen)
    assert text == hf.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen)
    assert ct.apply(messages, tools=tools, add_generation_prompt=gen) == hf.encode(text, add_special_tokens=False)


def test_packaged_template_layout(ct):
    text = ct.render([USER], tools=TOOLS, add_generation_prompt=True)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools\n")
    tools_block = text[text.index("<tools>\n") + 8:text.index("\n</tools>")]
    assert [json.loads(line) for line in tools_block.split("\n")] == TOOLS
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in text
    assert text.endswith("<|im_start|>user\nHow many singers are from France?<|im_end|>\n<|im_start|>assistant\n")
    rendered_call = ct.render([USER, STRUCTURED_CALL])
    assert f"<|im_start|>assistant\n{CALL}<|im_end|>\n" in rendered_call
    assert ct.eos_token_id == ct.tokenizer.token_to_id("<|im_end|>")


def test_continuation_is_the_text_after_assistant_content(ct):
    tool = {"role": "tool", "content": "R"}
    assert ct.continuation([tool]) == ("<|im_end|>\n<|im_start|>user\n<tool_response>\nR\n</tool_response>"
                                       "<|im_end|>\n<|im_start|>assistant\n")
    assert ct.continuation([{"role": "user", "content": "Q"}]) == (
        "<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n")


def _run_segment(ct, first, turns, tools, *, eos=True, logprobs=True):
    """Drive a Segment: ``turns`` is [(completion_text, observation_messages)], the last observation may be []."""
    seg = Segment(ct, first, tools=tools)
    full = list(first)
    expected_mask_positions = []
    for i, (completion, obs) in enumerate(turns):
        ids = ct.encode(completion) + ([ct.eos_token_id] if eos else [])
        lps = [-0.1 * (i + 1) - j * 1e-3 for j in range(len(ids))] if logprobs else None
        start = len(seg)
        turn = seg.add_completion(ids, lps)
        assert turn.prompt_ids == tuple(seg.input_ids[:start]) and turn.completion_ids == tuple(ids)
        expected_mask_positions.extend(range(start, start + len(ids)))
        full.append({"role": "assistant", "content": completion})
        if obs:
            seg.add_observation(obs)
            full.extend(obs)
    return seg, full, expected_mask_positions


def test_segment_equals_rendering_the_whole_conversation(ct):
    tool1 = {"role": "tool", "content": '{"ref": "E1", "columns": ["n"], "rows": [[3]], "truncated": false}'}
    tool2 = {"role": "tool", "content": "Estimate: rows p50=1 p95=1."}
    nudge = {"role": "user", "content": "Budget: queries 1/2. Answer now."}
    turns = [(CALL, [tool1]), ("Let me check the estimate first.\n" + CALL, [tool1, tool2]),
             ("I will answer.", [nudge]),
             ('<tool_call>\n{"name": "answer", "arguments": {"values": [3]}}\n</tool_call>', [])]
    seg, full, positions = _run_segment(ct, [SYSTEM, USER], turns, TOOLS)
    # token-in/token-out: the concatenation is exactly the template's rendering of the whole conversation (which
    # closes the final assistant turn with a newline after the sampled <|im_end|>)
    assert ct.decode(seg.input_ids) + "\n" == ct.render(full, tools=TOOLS)
    assert seg.input_ids + ct.encode("\n") == ct.apply(full, tools=TOOLS)
    # the mask covers exactly the sampled tokens, and the logprobs are aligned with them
    assert [i for i, m in enumerate(seg.loss_mask) if m] == positions
    assert len(seg.logprobs) == len(seg.loss_mask) == len(seg.input_ids)
    sampled = [lp for t in seg.turns for lp in t.completion_logprobs]
    assert [seg.logprobs[i] for i in positions] == sampled
    assert all(lp == 0.0 for lp, m in zip(seg.logprobs, seg.loss_mask) if not m)
    assert seg.completion_tokens == sum(len(t.completion_ids) for t in seg.turns)
    assert seg.prompt_len == len(ct.apply([SYSTEM, USER], tools=TOOLS, add_generation_prompt=True))


def test_length_capped_completion_gets_the_closing_tokens_unmasked(ct):
    tool = {"role": "tool", "content": "error: the result was cut"}
    seg, full, positions = _run_segment(ct, [USER], [("SELECT name FROM sing", [tool])], None, eos=False)
    assert ct.decode(seg.input_ids) == ct.render(full, add_generation_prompt=True)
    eos_positions = [i for i, t in enumerate(seg.input_ids) if t == ct.eos_token_id]
    assert positions[-1] + 1 in eos_positions and seg.loss_mask[positions[-1] + 1] == 0


def test_segment_without_logprobs_and_out_of_order_calls(ct):
    seg = Segment(ct, [USER])
    with pytest.raises(ChatTemplateError):
        seg.add_observation([{"role": "tool", "content": "x"}])
    seg.add_completion(ct.encode("hi") + [ct.eos_token_id])
    assert seg.logprobs is None
    with pytest.raises(ChatTemplateError):
        seg.add_completion([1, 2])
    with pytest.raises(ChatTemplateError):
        seg.add_observation([])
    with pytest.raises(EngineError, match="1 logprobs for 2 completion ids"):
        TurnTokens((1,), (2, 3), (0.0,))


def test_context_rewritten_starts_a_new_segment(ct):
    traj = TokenTrajectory(ct, [SYSTEM, USER], tools=TOOLS)
    first_prompt = traj.prompt_ids
    traj.add_completion(ct.encode(CALL) + [ct.eos_token_id], [-0.5] * (len(ct.encode(CALL)) + 1))
    traj.add_observation([{"role": "tool", "content": "rows: 1000 (archived as E1)"}])
    traj.add_completion(ct.encode(CALL) + [ct.eos_token_id])
    rewritten = [SYSTEM, USER, {"role": "assistant", "content": CALL},
                 {"role": "tool", "content": "[E1 archived: 1000 rows, profile only]"},
                 {"role": "assistant", "content": CALL}, {"role": "tool", "content": "rows: [[3]]"}]
    with pytest.raises(ChatTemplateError):
        traj.add_observation(rewritten[-1:], context_rewritten=True)
    traj.add_observation(rewritten[-1:], context_rewritten=True, conversation=rewritten)
    assert len(traj.segments) == 2
    assert traj.segments[0].input_ids[:len(first_prompt)] == first_prompt
    assert traj.prompt_ids == ct.apply(rewritten, tools=TOOLS, add_generation_prompt=True)
    assert sum(traj.segments[1].loss_mask) == 0 and len(traj.turns) == 2
    traj.add_completion(ct.encode("Done.") + [ct.eos_token_id])
    assert traj.segments[1].completion_tokens == len(ct.encode("Done.")) + 1


_TEXT = st.text(alphabet=st.sampled_from(list("abcdefgh XYZ019.,:;!?()[]{}\"'=*<>-_\n")), min_size=1, max_size=60)


@settings(max_examples=60, deadline=None)
@given(first=_TEXT, steps=st.lists(st.tuples(_TEXT, st.lists(_TEXT, min_size=1, max_size=3), st.booleans()),
                                   min_size=1, max_size=4))
def test_segment_text_is_always_the_full_rendering(ct, first, steps):
    turns = [(c, [{"role": "tool" if is_tool else "user", "content": o} for o in obs])
             for c, obs, is_tool in steps]
    seg, full, positions = _run_segment(ct, [{"role": "user", "content": first}], turns, None)
    assert ct.decode(seg.input_ids) == ct.render(full, add_generation_prompt=True)
    assert sum(seg.loss_mask) == len(positions)


def test_template_features_of_real_model_folders(tmp_path, ct):
    """A Qwen3-style template: namespace, reverse scans, string methods, a think block on the last assistant turn
    (not prefix-stable), strftime_now and raise_exception, in a chat_template.jinja that wins over the config."""
    shutil.copy(DEFAULT_TOKENIZER_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    shutil.copy(DEFAULT_TOKENIZER_DIR / "tokenizer_config.json", tmp_path / "tokenizer_config.json")
    (tmp_path / "chat_template.jinja").write_text(QWEN3_WITH_CHECKS)
    q3 = ChatTemplate.from_dir(tmp_path)
    assert q3.render([USER, {"role": "assistant", "content": "hi"}]).endswith("<think>\n\n</think>\n\nhi<|im_end|>\n")
    assert q3.continuation([{"role": "tool", "content": " R "}]) == (
        "<|im_end|>\n<|im_start|>user\n<tool_response>\nR\n</tool_response><|im_end|>\n<|im_start|>assistant\n")
    seg = Segment(q3, [USER])
    seg.add_completion(q3.encode("x") + [q3.eos_token_id])
    seg.add_observation([{"role": "tool", "content": "R"}])
    assert q3.decode(seg.input_ids).endswith("x<|im_end|>\n<|im_start|>user\n<tool_response>\nR\n"
                                             "</tool_response><|im_end|>\n<|im_start|>assistant\n")
    no_think = Segment(q3, [USER], enable_thinking=False)  # template kwargs reach every observation too
    no_think.add_completion(q3.encode("x") + [q3.eos_token_id])
    no_think.add_observation([{"role": "tool", "content": "R"}])
    assert q3.decode(no_think.input_ids).count("<|im_start|>assistant\n<think>\n\n</think>\n\n") == 2
    with pytest.raises(ChatTemplateError, match="bad role robot"):
        q3.render([{"role": "robot", "content": "beep"}])


def test_named_templates_and_bad_folders(tmp_path):
    shutil.copy(DEFAULT_TOKENIZER_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    config = {"eos_token": {"content": "<|im_end|>"}, "chat_template": [
        {"name": "default", "template": "D{{ messages|length }}{{ eos_token }}"},
        {"name": "tool_use", "template": "T{{ tools|length }}"}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    named = ChatTemplate.from_dir(tmp_path)
    assert named.render([USER]) == "D1<|im_end|>"
    assert named.render([USER], tools=TOOLS) == "T2"
    assert named.render([USER], tools=TOOLS, template_name="default") == "D1<|im_end|>"
    with pytest.raises(ChatTemplateError):
        named.render([USER], template_name="missing")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{% if %}"}))
    with pytest.raises(ChatTemplateError, match="does not compile"):
        ChatTemplate.from_dir(tmp_path).render([USER])
    (tmp_path / "tokenizer_config.json").write_text("{}")
    with pytest.raises(ConfigError, match="no chat_template"):
        ChatTemplate.from_dir(tmp_path)
    with pytest.raises(ConfigError, match="no tokenizer.json"):
        ChatTemplate.from_dir(tmp_path / "nowhere")


@pytest.mark.parametrize("source, message", [
    ("{{ messages.__class__.__mro__ }}", "unsafe"),
    ("{% set ns = namespace() %}{% set ns._x = 1 %}", "cannot set '_x'"),
])
def test_sandbox_blocks_unsafe_attribute_access(tmp_path, source, message):
    shutil.copy(DEFAULT_TOKENIZER_DIR / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": source}))
    with pytest.raises(ChatTemplateError, match=message):
        ChatTemplate.from_dir(tmp_path).render([USER])
