"""Benchmark of the packaged tokenizer and token-in/token-out chat segments.

Prints the build time of the packaged tokenizer, its characters per token on each kind of text it was made for
(compared with the dependency-free regex approximation; in-distribution generator text, and Spider's train questions and
SQL when ../shared/data/spider_train is present), and how fast `Segment` appends completions and
observations (the per-turn cost the rollout loop pays instead of re-templating).

    python benchmarks/bench_tokenizer.py
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

from bapsql.models.chat_template import ChatTemplate
from bapsql.policies.chat import Segment
from bapsql.models import tokenizer_corpus as corpus
from bapsql.models.tokenizer_build import build_tokenizer
from bapsql.tokens import DEFAULT_TOKENIZER_DIR, RegexTokenCounter


def main() -> None:
    with tempfile.TemporaryDirectory() as out:
        t0 = time.perf_counter()
        result = build_tokenizer(out)
        print(f"build: vocab {result.vocab_size}, {result.corpus_lines} corpus lines, "
              f"{time.perf_counter() - t0:.2f} s")
    ct = ChatTemplate.from_dir(DEFAULT_TOKENIZER_DIR)
    regex = RegexTokenCounter()
    rng = random.Random(123)  # a seed the corpus was not built with
    kinds = {"sql": corpus._sql, "question": corpus._question, "tool_call": corpus._tool_call,
             "observation": corpus._observation, "prose": corpus._prose}
    for name, make in kinds.items():
        texts = [make(rng) for _ in range(2000)]
        chars = sum(len(t) for t in texts)
        toks = sum(len(ct.encode(t)) for t in texts)
        approx = sum(regex.count(t) for t in texts)
        print(f"{name:12s} {chars / toks:5.2f} chars/token (regex approximation: {chars / approx:5.2f})")

    spider = Path(__file__).resolve().parents[2] / "shared" / "data" / "spider_train" / "train_spider.json"
    if spider.is_file():  # real, out-of-distribution text: Spider's questions and gold SQL
        items = json.loads(spider.read_text())
        for name, key in (("spider q", "question"), ("spider sql", "query")):
            texts = [it[key] for it in items]
            chars = sum(len(t) for t in texts)
            toks = sum(len(ct.encode(t)) for t in texts)
            approx = sum(regex.count(t) for t in texts)
            print(f"{name:12s} {chars / toks:5.2f} chars/token (regex approximation: {chars / approx:5.2f}), "
                  f"{len(texts)} texts")

    tool = [{"role": "tool", "content": '{"ref": "E1", "columns": ["n"], "rows": [[3]], "truncated": false}'}]
    completion = ct.encode('<tool_call>\n{"name": "execute_query", "arguments": {"sql": "SELECT COUNT(*) FROM '
                           'singer"}}\n</tool_call>') + [ct.eos_token_id]
    t0, turns = time.perf_counter(), 0
    for _ in range(200):
        seg = Segment(ct, [{"role": "user", "content": "How many singers are there?"}])
        for _ in range(10):
            seg.add_completion(completion, [-0.1] * len(completion))
            seg.add_observation(tool)
            turns += 1
    dt = time.perf_counter() - t0
    print(f"segment: {turns} turns (completion + observation) in {dt:.2f} s = {dt / turns * 1e6:.0f} us/turn")


if __name__ == "__main__":
    main()
