"""SFT export: turn-level pairs from the workflows, loss masks exactly on the completion, deduplicated."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from bapsql.models.chat_template import ChatTemplate
from bapsql.policies.sft_export import export_sft, pair_key
from bapsql.tokens import DEFAULT_TOKENIZER_DIR
from tests.policies.templates import QWEN3_STYLE

COLUMNS = ["prompt", "completion", "prompt_ids", "completion_ids", "input_ids", "loss_mask", "workflow", "budget",
           "task_id", "db_id", "turn", "seed"]


@pytest.fixture(scope="module")
def exported(minibench, tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "pairs.parquet"
    res = export_sft(minibench, "train", 60, out, seed=0)
    return res, pq.read_table(out).to_pylist()


def test_columns_and_counts(exported):
    res, rows = exported
    assert res.pairs == len(rows) == 60
    assert list(rows[0]) == COLUMNS
    assert {r["budget"] for r in rows} <= {"XS", "S", "M", "L"}
    assert {r["db_id"] for r in rows} == {"shop"}  # the train split only
    assert sum(res.per_workflow.values()) == 60 and len(res.per_workflow) == 9


def test_loss_mask_covers_exactly_the_completion_tokens(exported):
    template = ChatTemplate.from_dir(DEFAULT_TOKENIZER_DIR)
    _, rows = exported
    for r in rows:
        assert r["input_ids"] == r["prompt_ids"] + r["completion_ids"]
        assert len(r["loss_mask"]) == len(r["input_ids"])
        assert r["loss_mask"] == [0] * len(r["prompt_ids"]) + [1] * len(r["completion_ids"])
        masked = [t for t, m in zip(r["input_ids"], r["loss_mask"]) if m]
        assert template.decode(masked) == r["completion"]
        assert template.decode(r["prompt_ids"]) == r["prompt"]
        assert r["completion"].startswith("<tool_call>") and r["completion"].endswith("<|im_end|>")
        assert r["prompt"].endswith("<|im_start|>assistant\n")


def test_pairs_are_unique_and_deterministic(exported, minibench, tmp_path):
    _, rows = exported
    keys = [pair_key(r["prompt"], r["completion"]) for r in rows]
    assert len(set(keys)) == len(keys)
    again = export_sft(minibench, "train", 60, tmp_path / "again.parquet", seed=0)
    assert pq.read_table(again.path).to_pylist() == rows


def test_export_stops_when_no_new_pairs_exist(minibench, tmp_path):
    res = export_sft(minibench, "train", 100_000, tmp_path / "all.parquet", workflows=("workflow.direct_aggregation",),
                     budgets=("L",))
    # one deterministic episode per task: execute + answer = 2 pairs for each of the 6 train tasks
    assert res.pairs == 12 and res.duplicates > 0


def test_no_planning_set_has_no_estimates_or_rewrites(minibench, tmp_path):
    res = export_sft(minibench, "train", 40, tmp_path / "np.parquet", condition="no_planning")
    rows = pq.read_table(res.path).to_pylist()
    assert rows and all("estimate_query" not in r["completion"] and "rewrite_query" not in r["completion"]
                        for r in rows)
    assert all("estimate_query(" not in r["prompt"] for r in rows)  # the tool is not offered in the system prompt




def test_a_scripted_episodes_token_stream_equals_the_sft_rendering(minibench, mini_tasks, tmp_path):
    """With ``enable_thinking: false`` on a Qwen3-style template, every SFT prompt is exactly the token stream the
    model agent builds when the same episode is played through it (completions fed as sampled tokens)."""
    import shutil
    from collections import defaultdict

    from bapsql.budgets import load_ladder
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.env.handles import DatabaseHandles
    from bapsql.env.records import EnvOptions
    from bapsql.rollout.agent import AgentConfig, ModelAgent
    from bapsql.rollout.engines.base import Generation
    from bapsql.tokens import HFTokenCounter

    tok = tmp_path / "qwen3-style"
    tok.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(DEFAULT_TOKENIZER_DIR / name, tok / name)
    (tok / "chat_template.jinja").write_text(QWEN3_STYLE)
    kwargs = {"enable_thinking": False}
    res = export_sft(minibench, "train", 60, tmp_path / "q3.parquet", seed=0, tokenizer_dir=tok,
                     template_kwargs=kwargs)
    rows = pq.read_table(res.path).to_pylist()
    assert all(r["prompt"].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") for r in rows)
    episodes = defaultdict(list)
    for r in rows:
        episodes[r["seed"]].append(r)
    full = [sorted(v, key=lambda r: r["turn"]) for v in episodes.values()]
    full = [e for e in full if [r["turn"] for r in e] == list(range(1, len(e) + 1)) and len(e) >= 2]
    assert len(full) >= 3
    template = ChatTemplate.from_dir(tok)
    ladder = load_ladder()
    think_blocks = []
    with DatabaseHandles(HFTokenCounter(tok, template_kwargs=kwargs)) as handles:
        for episode in full[:6]:
            first = episode[0]
            opts = EnvOptions()  # the export ran every workflow under the full condition
            env = BudgetedSQLEnv(token_counter=handles.token_counter, handles=handles, options=opts)
            agent = ModelAgent(env, template, AgentConfig(str(tok), max_tokens=4096, template_kwargs=kwargs),
                               episode_key="e", seed=first["seed"])
            agent.reset(mini_tasks[first["task_id"]], ladder[first["budget"]])
            for r in episode:
                req = agent.request()
                assert list(req.prompt_ids) == r["prompt_ids"], (first["workflow"], r["turn"])
                assert len(req.prompt_ids) == agent.info["ledger"]["spent"]["context_tokens"]  # think blocks charged
                agent.advance(Generation(req.prompt_ids, tuple(r["completion_ids"]), r["completion"], None, "stop"))
            think_blocks.append(template.decode(episode[-1]["prompt_ids"]).count("<think>\n\n</think>"))
    # past turns keep their empty think blocks in the stream (a fresh rendering would drop them; a segment started
    # after evidence management rewrote the context renders afresh)
    assert max(think_blocks) >= 2


@pytest.mark.parametrize("family", ["smollm2", "llama3", "qwen3", "qwen3_5"])
def test_the_sft_stream_equals_the_rollout_stream_for_other_template_families(minibench, mini_tasks, tmp_path,
                                                                                family):
    """SmolLM2's ChatML (plain tool turns), Llama 3's headers, Qwen3's and Qwen3.5's released templates (default
    options; Qwen3.5 renders nothing without a user query): SFT targets end with the template's own end of turn
    and every SFT prompt is the token stream the model agent builds for the same episode, its context figure
    included (the env charges the family's overheads, not ChatML's)."""
    from collections import defaultdict

    from bapsql.budgets import load_ladder
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.env.handles import DatabaseHandles
    from bapsql.rollout.agent import AgentConfig, ModelAgent
    from bapsql.rollout.engines.base import Generation
    from bapsql.tokens import HFTokenCounter
    from tests.models.chat_families import END_OF_TURN, make_family_dir

    tok = make_family_dir(tmp_path, family)
    res = export_sft(minibench, "train", 40, tmp_path / f"{family}.parquet", seed=0, tokenizer_dir=tok)
    rows = pq.read_table(res.path).to_pylist()
    template = ChatTemplate.from_dir(tok)
    generation_prompt = template.framing().generation_prompt
    assert rows and all(r["completion"].endswith(END_OF_TURN[family]) for r in rows)
    assert all(r["completion_ids"][-1] == template.tokenizer.token_to_id(END_OF_TURN[family]) for r in rows)
    assert all(r["prompt"].endswith(generation_prompt) for r in rows)
    episodes = defaultdict(list)
    for r in rows:
        episodes[r["seed"]].append(r)
    full = [sorted(v, key=lambda r: r["turn"]) for v in episodes.values()]
    full = [e for e in full if [r["turn"] for r in e] == list(range(1, len(e) + 1)) and len(e) >= 2]
    assert len(full) >= 3
    ladder = load_ladder()
    with DatabaseHandles(HFTokenCounter(tok)) as handles:
        for episode in full[:4]:
            first = episode[0]
            env = BudgetedSQLEnv(token_counter=handles.token_counter, handles=handles)
            agent = ModelAgent(env, template, AgentConfig(str(tok), max_tokens=4096), episode_key="e",
                               seed=first["seed"])
            agent.reset(mini_tasks[first["task_id"]], ladder[first["budget"]])
            for r in episode:
                req = agent.request()
                assert list(req.prompt_ids) == r["prompt_ids"], (first["workflow"], r["turn"])
                assert len(req.prompt_ids) == agent.info["ledger"]["spent"]["context_tokens"]
                agent.advance(Generation(req.prompt_ids, tuple(r["completion_ids"]), r["completion"], None, "stop"))
                assert agent.completions[-1] + END_OF_TURN[family] == r["completion"]


def test_per_episode_rows_are_the_whole_stream_with_every_completion_in_the_loss(minibench, tmp_path):
    from bapsql.env.records import EnvOptions

    template = ChatTemplate.from_dir(DEFAULT_TOKENIZER_DIR)
    pairs = export_sft(minibench, "train", 100, tmp_path / "pairs.parquet", workflows=("workflow.direct_aggregation",),
                       budgets=("L",), env_options=EnvOptions(prompt_style="terse"))
    eps = export_sft(minibench, "train", 100, tmp_path / "eps.parquet", workflows=("workflow.direct_aggregation",),
                     budgets=("L",), env_options=EnvOptions(prompt_style="terse"), per_episode=True)
    prow = pq.read_table(pairs.path).to_pylist()
    erow = pq.read_table(eps.path).to_pylist()
    assert eps.pairs == 6 and pairs.pairs == 12  # one row per episode of the 6 train tasks (2 turns each)
    for e in erow:
        assert e["turn"] == 2 and len(e["loss_mask"]) == len(e["input_ids"])
        assert e["prompt"].startswith("<|im_start|>system\nSQLite questions.")  # the terse system prompt
        last = next(p for p in prow if p["task_id"] == e["task_id"] and p["turn"] == 2)
        assert template.decode(e["input_ids"]) == last["prompt"] + last["completion"]  # the whole episode
        masked = [t for t, m in zip(e["input_ids"], e["loss_mask"]) if m]
        comps = [p["completion"] for p in sorted((p for p in prow if p["task_id"] == e["task_id"]),
                                                 key=lambda p: p["turn"])]
        assert template.decode(masked) == "".join(comps)  # exactly the two completions are in the loss


def test_only_successes_and_given_tasks(minibench, mini_tasks, tmp_path):
    few = [t for t in mini_tasks.values() if t.db_id == "shop"][:2]
    res = export_sft(minibench, "train", 100, tmp_path / "few.parquet", workflows=("workflow.direct_aggregation",),
                     budgets=("L",), tasks=few, only_successes=True, per_episode=True)
    rows = pq.read_table(res.path).to_pylist()
    assert {r["task_id"] for r in rows} <= {t.task_id for t in few} and res.pairs == len(rows) >= 1


@pytest.mark.parametrize("level, tool", [("XS", "estimate_query"), ("L", "execute_query")])
def test_a_staged_slip_is_played_but_kept_out_of_the_loss(minibench, tmp_path, level, tool):
    """``workflow.recover_from_error``: its first query names a column that does not exist; the error it gets, the
    schema, the gold query and the answer follow. The slip is in the prompt the model sees, never in its loss: no
    per-turn row of its own, and mask 0 in the per-episode stream. On a tight budget (XS) the slip is estimated, as
    every workflow's first query is there, and the error comes from the estimate; on L it is executed."""
    from bapsql.env.records import EnvOptions

    template = ChatTemplate.from_dir(DEFAULT_TOKENIZER_DIR)
    kw = dict(workflows=("workflow.recover_from_error",), budgets=(level,), env_options=EnvOptions(prompt_style="terse"))
    turns = pq.read_table(export_sft(minibench, "train", 100, tmp_path / "t.parquet", **kw).path).to_pylist()
    eps = pq.read_table(export_sft(minibench, "train", 100, tmp_path / "e.parquet", per_episode=True,
                                   **kw).path).to_pylist()
    slipped = [e for e in eps if "no such column" in e["prompt"]]
    assert slipped, "no episode of the mini benchmark staged a slip"
    for e in slipped:
        queries = e["prompt"].count('"execute_query"') + e["prompt"].count('"estimate_query"')
        assert queries == 1 and e["prompt"].count(f'"{tool}"') == 1  # the slip is the prompt's only query ...
        masked = template.decode([t for t, m in zip(e["input_ids"], e["loss_mask"]) if m])
        assert "no such column" not in masked and masked.startswith("<tool_call>")
        assert '"inspect_schema"' in masked.split("</tool_call>")[0]  # ... and the first trained call inspects
        own = sorted((p for p in turns if (p["task_id"], p["seed"]) == (e["task_id"], e["seed"])),
                     key=lambda p: p["turn"])
        assert own[0]["turn"] == 2 and "no such column" in own[0]["prompt"]  # no row for the slip itself
        assert masked == "".join(p["completion"] for p in own)


def test_shares_under_several_conditions_are_equal_and_labelled(minibench, tmp_path):
    """`export_sft_shares`: 10 pairs over three conditions are 4 + 3 + 3, each share exported under its own condition
    (the raw prompt shows no budget line), one file with a `condition` column; a single condition is `export_sft`."""
    from collections import Counter

    from bapsql.errors import ConfigError
    from bapsql.policies.sft_export import export_sft_shares

    out = tmp_path / "pairs.parquet"
    kw = {"workflows": ("workflow.direct_aggregation",), "seed": 0}
    exports = export_sft_shares(("dashboard", "raw", "full"), minibench, "train", 10, out, **kw)
    rows = pq.read_table(out).to_pylist()
    assert [e.pairs for e in exports] == [4, 3, 3]
    assert Counter(r["condition"] for r in rows) == {"dashboard": 4, "raw": 3, "full": 3}
    assert [e.path.name for e in exports] == ["pairs-dashboard.parquet", "pairs-raw.parquet", "pairs-full.parquet"]
    raw = [r for r in rows if r["condition"] == "raw"]
    alone = pq.read_table(export_sft(minibench, "train", 3, tmp_path / "raw.parquet", condition="raw", **kw).path)
    assert [r["prompt"] for r in raw] == alone.column("prompt").to_pylist()  # a share is that condition's export
    single = export_sft_shares(("raw",), minibench, "train", 3, tmp_path / "one.parquet", **kw)
    assert len(single) == 1 and "condition" not in pq.read_table(single[0].path).column_names
    with pytest.raises(ConfigError, match="fewer than one per condition"):
        export_sft_shares(("raw", "full"), minibench, "train", 1, tmp_path / "x.parquet", **kw)


def test_branch_tries_holds_a_branching_workflows_slot_until_it_rewrites(minibench, mini_tasks, tmp_path):
    """``branch_tries``: estimate_rewrite keeps its slot until an episode rewrites a warned draft. Half the tasks get a
    draft that is the gold aggregate itself (nothing warns: the plain path, estimate then execute), half keep their
    row listing (it overflows every level here). Off, estimate_rewrite's kept episodes are both kinds; on, only
    rewrites, on the listing tasks. The plain workflow's episodes are untouched."""
    from dataclasses import replace

    from bapsql.errors import ConfigError

    shop = sorted((t for t in mini_tasks.values() if t.db_id == "shop"), key=lambda t: t.task_id)
    calm = [replace(t, naive_sql=t.gold_sql) for t in shop[: len(shop) // 2]]
    listing = {t.task_id for t in shop[len(shop) // 2:]}
    kw = {"workflows": ("workflow.estimate_rewrite", "workflow.direct_aggregation"), "seed": 0, "per_episode": True,
          "tasks": calm + shop[len(shop) // 2:]}
    off = export_sft(minibench, "train", 12, tmp_path / "off.parquet", **kw)
    on = export_sft(minibench, "train", 12, tmp_path / "on.parquet", branch_tries=20, **kw)
    rows = {name: pq.read_table(res.path).to_pylist() for name, res in (("off", off), ("on", on))}
    er = {name: [r for r in rs if r["workflow"] == "workflow.estimate_rewrite"] for name, rs in rows.items()}
    rewrote = {name: ['"name": "rewrite_query"' in r["completion"] for r in rs] for name, rs in er.items()}
    assert rewrote["on"] and all(rewrote["on"]) and {r["task_id"] for r in er["on"]} <= listing
    assert not all(rewrote["off"]), "without branch_tries some estimate_rewrite episodes play the plain path"
    # kept episodes that rewrote, rows or not (a duplicate of an earlier episode adds none)
    assert set(on.branched) == {"workflow.estimate_rewrite"}
    assert on.branched["workflow.estimate_rewrite"] >= len(er["on"])
    assert off.branched.get("workflow.estimate_rewrite", 0) >= sum(rewrote["off"])
    assert on.episodes > on.kept_episodes  # the held slots played episodes that were dropped
    assert sum(r["workflow"] == "workflow.direct_aggregation" for r in rows["on"]) >= 5
    with pytest.raises(ConfigError, match="branch_tries must be >= 0"):
        export_sft(minibench, "train", 1, tmp_path / "bad.parquet", branch_tries=-1)


def test_branch_tries_off_is_the_plain_rotation(exported, minibench, tmp_path):
    """``branch_tries: 0`` leaves the export as it was: the same rows as the default."""
    _, rows = exported
    again = export_sft(minibench, "train", 60, tmp_path / "zero.parquet", seed=0, branch_tries=0)
    assert pq.read_table(again.path).to_pylist() == rows


def test_a_workflow_whose_branch_never_comes_still_keeps_its_share(minibench, tmp_path):
    """justified_abstention only abstains when even the gold aggregate cannot run; at L nothing is out of reach, so
    with ``branch_tries`` its slot gives up after k episodes and the k-th is kept by the usual rules."""
    res = export_sft(minibench, "train", 6, tmp_path / "ja.parquet", seed=0, per_episode=True, budgets=("L",),
                     workflows=("workflow.justified_abstention",), branch_tries=3)
    assert res.pairs >= 1 and res.branched == {} and res.episodes >= 3 * res.kept_episodes


def test_the_export_counts_the_kept_episodes_that_start_with_an_estimate_per_level(minibench, tmp_path):
    """direct_aggregation estimates first where the dashboard shows a tight budget: every kept XS episode, no L
    episode; the count is of kept episodes, per level, in the ladder's order."""
    res = export_sft(minibench, "train", 40, tmp_path / "first.parquet", seed=0, per_episode=True,
                     budgets=("XS", "L"), workflows=("workflow.direct_aggregation",))
    assert list(res.kept_per_budget) == ["XS", "L"] and sum(res.kept_per_budget.values()) == res.kept_episodes
    assert 0 < res.estimate_first["XS"] == res.kept_per_budget["XS"] and res.estimate_first.get("L", 0) == 0
    assert res.estimate_first_line() == (f"XS {res.estimate_first['XS']}/{res.kept_per_budget['XS']}, "
                                         f"L 0/{res.kept_per_budget['L']}")
