"""Live-context accounting of the transcript (bapsql/env/transcript.py)."""

from __future__ import annotations

from bapsql.env.transcript import GENERATION_PROMPT_TOKENS, TEMPLATE_OVERHEAD, Transcript
from bapsql.tokens import RegexTokenCounter


def test_live_and_prompt_include_template_overhead():
    count = RegexTokenCounter().count
    tx = Transcript(RegexTokenCounter(), lambda ref: "")
    tx.append("system", "You are a helper.")
    tx.append("user", "How many rows?")
    tx.append("assistant", "<tool_call>{}</tool_call>")
    tx.append("tool", "E1: 3 rows")
    expected = sum(count(t) for t in ("You are a helper.", "How many rows?", "<tool_call>{}</tool_call>", "E1: 3 rows"))
    expected += 3 * TEMPLATE_OVERHEAD["user"] + TEMPLATE_OVERHEAD["tool"]
    assert tx.live() == expected and tx.prompt() == expected + GENERATION_PROMPT_TOKENS
    assert len(tx) == 4 and [m["role"] for m in tx.messages()] == ["system", "user", "assistant", "tool"]


def test_block_messages_rerender_in_place():
    bodies = {"E1": "a | b\n1 | 2\n3 | 4\n5 | 6"}
    tx = Transcript(RegexTokenCounter(), lambda ref: bodies[ref])
    tx.append("tool", "E1 (ok):\n", ref="E1", tail="\n[left] ...")
    before = tx.live()
    stub = "[E1 archived]"
    predicted = tx.delta_if("E1", stub)
    bodies["E1"] = stub
    assert tx.rerender("E1") == predicted < 0
    assert tx.live() == before + predicted and tx.messages()[0]["content"] == "E1 (ok):\n[E1 archived]\n[left] ..."
