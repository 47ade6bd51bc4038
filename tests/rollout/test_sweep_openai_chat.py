"""A sweep of a hosted chat model: ``model:chat`` with an ``openai_chat`` engine (YAML config) played by the
sweep's agent loop (continuous batching through `Engine.step`) against a scripted chat server on loopback.
(`bapsql eval` takes an engine only as ``--posthoc-engine``: tests/rollout/test_engines_openai_chat.py.)"""

from __future__ import annotations

import pytest

from bapsql.logs.reader import read_table
from tests.rollout.fakes import gold_plan
from tests.rollout.rollout_bench import build_rollout_bench
from tests.serve.chat_server import ScriptedChatServer


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    return build_rollout_bench(tmp_path_factory.mktemp("bench"))


@pytest.mark.slow  # a whole local sweep: ~50 s on the shared 2-core machine
def test_a_sweep_runs_a_chat_engine_from_its_yaml(bench, tmp_path):
    from bapsql.experiment import load_experiment
    from bapsql.data.tasks import load_tasks
    from bapsql.rollout.sweep import run_sweep

    tasks = load_tasks(bench, "dev", limit=4)
    with ScriptedChatServer({t.question: gold_plan(t) for t in tasks}, usage=False) as server:
        yaml = tmp_path / "chat.yaml"
        yaml.write_text(f"""run: chat
benchmark: {bench}
split: dev
limit: 4
methods: ["model:chat@full"]
budgets: [S, M]
seeds: [0]
engines:
  chat: {{kind: openai_chat, model: scripted, base_url: "{server.base_url}", max_model_len: 16384, max_num_seqs: 4}}
sampling: {{max_tokens: 128, temperature: 0.0}}
workers: {{env_workers: 1}}
""")
        s = run_sweep(load_experiment(yaml), out_dir=tmp_path / "run", backend="local")
    assert s.result.episodes_run == 8
    eps = read_table(tmp_path / "run", "episodes").to_pandas()
    assert (eps.method == "model.chat@full").all() and eps.success.all()
    assert len(server.requests) == 16 and all("messages" in r for r in server.requests)

