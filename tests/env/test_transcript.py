"""Live-context accounting of the transcript (bapsql/env/transcript.py)."""

from __future__ import annotations

from bapsql.env.transcript import Transcript, framing_of
from bapsql.models.framing import DEFAULT_FRAMING, ChatFraming
from bapsql.tokens import RegexTokenCounter


def test_live_and_prompt_include_template_overhead():
    count = RegexTokenCounter().count
    tx = Transcript(RegexTokenCounter(), lambda ref: "")
    tx.append("system", "You are a helper.")
    tx.append("user", "How many rows?")
    tx.append("assistant", "<tool_call>{}</tool_call>")
    tx.append("tool", "E1: 3 rows")
    expected = sum(count(t) for t in ("You are a helper.", "How many rows?", "<tool_call>{}</tool_call>", "E1: 3 rows"))
    expected += 5 + 5 + 5 + 9  # the default framing: Qwen2.5 ChatML, tool results as <tool_response> user turns
    assert tx.live() == expected and tx.prompt() == expected + 3
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


def test_overheads_come_from_the_counters_framing():
    """A counter's framing (here Llama-3-like numbers) replaces the ChatML constants; a counter without one gets the
    default."""
    llama = ChatFraming(overhead={"system": 6, "user": 5, "assistant": 5, "tool": 6}, generation_prompt_tokens=4,
                        trailer_tokens=1, end_of_turn_text="<|eot_id|>")

    class Counter:
        name, framing = "llama-like", llama

        def count(self, text: str) -> int:
            return len(text.split())

    tx = Transcript(Counter(), lambda ref: "")
    assert tx.framing is llama and tx.generation_prompt_tokens == 4 and tx.trailer_tokens == 1
    tx.append("system", "a b")
    tx.append("tool", "c")
    assert tx.live() == 2 + 6 + 1 + 6 and tx.prompt() == tx.live() + 4

    class Bare:
        name = "bare"

        def count(self, text: str) -> int:
            return 1

    assert framing_of(Bare()) is DEFAULT_FRAMING and framing_of(RegexTokenCounter()) is DEFAULT_FRAMING


def test_a_fresh_rendering_recharges_past_assistant_turns():
    """Qwen3-like: a streamed assistant turn costs 9 (its generation prompt carries an empty think block); once the
    conversation is rendered afresh after a rewrite, past turns cost 5 — `delta_if` predicts it, `rerender` applies it
    once."""
    qwen3 = ChatFraming(overhead={"system": 5, "user": 5, "assistant": 9, "tool": 9}, generation_prompt_tokens=7,
                        trailer_tokens=2, end_of_turn_text="<|im_end|>", past_assistant_overhead=5)
    counter = RegexTokenCounter()
    bodies = {"E1": "a | b\n1 | 2"}
    tx = Transcript(counter, lambda ref: bodies[ref], qwen3)
    tx.append("system", "You are a helper.")
    tx.append("assistant", "call one")
    tx.append("tool", "E1:\n", ref="E1")
    tx.append("assistant", "call two")
    before = tx.live()
    predicted = tx.delta_if("E1", "[E1 archived]")
    bodies["E1"] = "[E1 archived]"
    assert tx.rerender("E1") == predicted
    body_delta = counter.count("E1:\n[E1 archived]") - counter.count("E1:\na | b\n1 | 2")
    assert predicted == body_delta + 2 * (5 - 9) and tx.live() == before + predicted
    tx.append("assistant", "call three")  # sampled after the rewrite: streamed again
    assert tx.delta_if("E1", "[E1 archived]") == 5 - 9
