"""The policy's view rendered with the packaged chat template: exactly what the env charges, and round-trippable."""

from __future__ import annotations

import pytest

from bapsql.models.chat_template import ChatTemplate
from bapsql.policies.chat import Segment
from bapsql.tokens import DEFAULT_TOKENIZER_DIR


@pytest.fixture(scope="module")
def template():
    return ChatTemplate.from_dir(DEFAULT_TOKENIZER_DIR)


@pytest.mark.parametrize("workflow,level", [("workflow.estimate_rewrite", "XS"), ("workflow.verify_answer", "L"),
                                            ("workflow.restore_after_archive", "M"), ("scripted.drafter@raw", "S")])
def test_rendered_prompt_is_the_live_context_the_env_charges(play, mini_tasks, template, workflow, level):
    got = play(workflow, mini_tasks["shop-00"], level)
    records = got.env.turn_records
    for msgs, rec in zip(got.messages, records):
        ids = template.apply(msgs, add_generation_prompt=True)
        assert len(ids) == rec.ctx_before  # token for token what the ledger counted as live context
        text = template.render(msgs, add_generation_prompt=True)
        assert template.decode(template.encode(text)) == text
        for m in msgs:
            assert m["content"] in text


def test_token_in_token_out_segment_matches_full_rendering(play, mini_tasks, template):
    """Without evidence management the conversation is one segment whose ids equal a fresh rendering."""
    got = play("workflow.verify_answer", mini_tasks["shop-00"], "L")
    seg = Segment(template, got.messages[0])
    for i, completion in enumerate(got.completions):
        assert seg.input_ids == template.apply(got.messages[i], add_generation_prompt=True)
        seg.add_completion(template.encode(completion + "<|im_end|>"))
        if i + 1 < len(got.messages):
            new = got.messages[i + 1][len(got.messages[i]) + 1:]
            seg.add_observation(new)
    masked = [t for t, m in zip(seg.input_ids, seg.loss_mask) if m]
    assert template.decode(masked) == "".join(c + "<|im_end|>" for c in got.completions)
