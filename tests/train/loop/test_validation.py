"""In-loop validation (bapsql.train.loop.validation): the held-out questions, the choice of the best update, the records
a resume keeps, and the GRPO stage keeping the validated best policy."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bapsql.errors import ConfigError
from bapsql.train.loop.validation import ValidationRecord, Validator, best_record, read_validation


def _rec(update: int, mean: float) -> ValidationRecord:
    return ValidationRecord(update=update, success={"XS": mean}, mean=mean, episodes=4, seconds=1.0)


def _slow_best(records):
    best = None
    for r in records:  # the first strictly higher mean wins, so a tie keeps the earlier update
        if best is None or r.mean > best.mean or (r.mean == best.mean and r.update < best.update):
            best = r
    return best


@given(st.lists(st.tuples(st.integers(0, 50), st.sampled_from([0.0, 0.25, 0.5, 0.75, 1.0])), min_size=1,
                max_size=12, unique_by=lambda x: x[0]))
def test_best_record_is_the_highest_success_and_the_earliest_on_a_tie(pairs):
    records = [_rec(u, m) for u, m in pairs]
    assert best_record(records) == _slow_best(records)
    assert best_record(records).mean == max(m for _, m in pairs)


def test_best_record_of_nothing_is_an_error():
    with pytest.raises(ValueError, match="no validation records"):
        best_record([])


def _cfg(**grpo):
    from bapsql.config import from_mapping
    from bapsql.train.config import TrainConfig

    return from_mapping(TrainConfig, {"name": "v", "model": {"base": "builtin:tiny"},
                                      "data": {"split": "train", "eval_split": "test"}, "grpo": grpo})


def test_validation_questions_are_held_out_from_sft_grpo_and_the_evaluation():
    from bapsql.data.augment import normalise
    from bapsql.data.tasks import load_tasks, resolve_benchmark
    from bapsql.train.loop.grpo_data import grpo_tasks
    from bapsql.train.loop.grpo_data import validation_tasks

    root = resolve_benchmark("demo")
    cfg = _cfg(prompts="augmented", prompt_rounds=1, validate_every=5, validation_tasks=21)
    prompts = grpo_tasks(cfg, 0, root)
    val = validation_tasks(cfg, 0, root, exclude=prompts)
    train, test = load_tasks(root, "train"), load_tasks(root, "test")
    banned = {normalise(t.question) for t in [*train, *test, *prompts]}
    assert len(val) == 21 and not any(normalise(t.question) in banned for t in val)
    dbs = sorted({t.db_id for t in train})
    assert {t.db_id for t in val} == set(dbs)  # database by database in turn: 21 tasks over 7 databases, 3 each
    assert all(sum(t.db_id == d for t in val) == 21 // len(dbs) for d in dbs)
    assert [t.question for t in validation_tasks(cfg, 0, root, exclude=prompts)] == [t.question for t in val]


@pytest.mark.parametrize("grpo, key", [({"keep": "best"}, "grpo.keep"),
                                       ({"validate_every": 5, "max_staleness": 1}, "grpo.validate_every"),
                                       ({"validate_every": -1}, "grpo.validate_every"),
                                       ({"keep": "first"}, "grpo.keep")])
def test_a_bad_validation_setting_is_named(grpo, key):
    with pytest.raises(ConfigError, match=key):
        _cfg(**grpo)


class _Rollouts:
    """Plays validation prompts with a fixed success per update (what the engines' policy would score)."""

    def __init__(self, success_by_update):
        self.success_by_update = success_by_update
        self.seeds = []

    def validate(self, prompts, version):
        from types import SimpleNamespace

        self.seeds.append({p.seed for p in prompts})
        rate = self.success_by_update[version]
        return [SimpleNamespace(episode={"success": i < rate * len(prompts)}) for i, _ in enumerate(prompts)]


class _Learner:
    def save_adapter(self, out):
        out.mkdir(parents=True, exist_ok=True)
        (out / "adapter_model.safetensors").write_text("x")
        return out


def test_the_validator_records_each_update_and_a_resume_drops_the_ones_it_redoes(tmp_path):
    from types import SimpleNamespace

    tasks = [SimpleNamespace(task_id=f"t{i}") for i in range(4)]
    rollouts = _Rollouts({0: 0.25, 5: 0.75, 10: 0.5})
    v = Validator(rollouts, _Learner(), tasks, ("XS", "S"), tmp_path)
    recs = [v.run(u) for u in (0, 5, 10)]
    assert [r.mean for r in recs] == [0.25, 0.75, 0.5] and recs[0].episodes == 8
    assert rollouts.seeds == [{0}, {5}, {10}]  # each round its own episode ids
    assert v.best().update == 5 and v.adapter_dir(5).is_dir()
    assert [r.update for r in read_validation(tmp_path / "validation.jsonl")] == [0, 5, 10]
    again = Validator(rollouts, _Learner(), tasks, ("XS", "S"), tmp_path)
    again.resume(7)  # the checkpoint of update 7: update 10 runs again
    assert [r.update for r in again.records] == [0, 5] and again.validated(5) and not again.validated(10)
    assert [json.loads(x)["update"] for x in (tmp_path / "validation.jsonl").read_text().splitlines()] == [0, 5]
    fresh = Validator(rollouts, _Learner(), tasks, ("XS",), tmp_path / "other")
    fresh.resume(0)
    assert fresh.records == []
    rerun = Validator(rollouts, _Learner(), tasks, ("XS", "S"), tmp_path)
    rerun.resume(None)  # a fresh run in the same folder: the earlier run's update 0 is not this run's
    assert rerun.records == [] and not rerun.validated(0) and read_validation(tmp_path / "validation.jsonl") == []
    with pytest.raises(ConfigError, match="at least one task"):
        Validator(rollouts, _Learner(), [], ("XS",), tmp_path)


def test_prune_keeps_only_the_best_adapter_and_every_record(tmp_path):
    """``keep_validated: best``: once the stage ends, the adapters of every record but the best one go; the curve
    (validation.jsonl) keeps every record, and a resume from the final checkpoint still chooses the same best."""
    from types import SimpleNamespace

    tasks = [SimpleNamespace(task_id=f"t{i}") for i in range(4)]
    rollouts = _Rollouts({0: 0.25, 5: 0.75, 10: 0.5, 15: 1.0})
    v = Validator(rollouts, _Learner(), tasks, ("XS",), tmp_path)
    for u in (0, 5, 10):
        v.run(u)
    assert v.prune() == [v.adapter_dir(0), v.adapter_dir(10)]
    assert [d.name for d in (tmp_path / "validated").iterdir()] == ["update-00005"]
    assert [r.update for r in read_validation(tmp_path / "validation.jsonl")] == [0, 5, 10]
    again = Validator(rollouts, _Learner(), tasks, ("XS",), tmp_path)
    again.resume(10)  # more updates after the finished stage: every record stays, update 5 is still the best
    assert [r.update for r in again.records] == [0, 5, 10] and again.best().update == 5
    again.run(15)
    assert again.best().update == 15 and again.prune() == [again.adapter_dir(5)]
    assert again.prune() == []


@pytest.mark.slow
def test_a_grpo_stage_keeps_the_validated_best_policy(tiny_model_dir, tmp_path):
    """The stage validates updates 0, 1, 2 with greedy episodes on held-out questions, logs them beside the updates,
    and with ``keep: best`` saves the best validated update's adapter as its policy, not the last one's: the
    untrained tiny model never succeeds, so every validation ties and the earliest (update 0) is kept."""
    from safetensors.torch import load_file

    from bapsql.train.config import DataSection, GRPOSection
    from bapsql.train.recipe.pipeline import run_grpo_stage
    from tests.train.tiny_stage import tiny_stage_config

    cfg = tiny_stage_config(
        "val", tiny_model_dir, tmp_path / "runs", DataSection(benchmark="demo", split="train", eval_split="test", limit=4),
        GRPOSection(lr=1e-2, updates=2, max_new_tokens=4, top_p=1.0, sft_init="none", prompts="augmented",
                    prompt_rounds=1, validate_every=1, validation_tasks=2, keep="best", keep_validated="all"))
    out = run_grpo_stage(cfg, 0)
    records = read_validation(out.run_dir / "validation.jsonl")
    assert [r.update for r in records] == [0, 1, 2] and all(r.episodes == 2 for r in records)
    assert all("val/success/all" in h for h in out.history)
    selected = json.loads((out.run_dir / "selected.json").read_text())
    assert selected["update"] == best_record(records).update == 0
    kept = load_file(str(out.adapter_dir / "adapter_model.safetensors"))
    first = load_file(str(out.run_dir / "validated" / "update-00000" / "adapter_model.safetensors"))
    last = load_file(str(out.run_dir / "validated" / "update-00002" / "adapter_model.safetensors"))
    ckpt = load_file(str(out.run_dir / "checkpoints" / "update-000002" / "adapter" / "adapter_model.safetensors"))
    assert kept.keys() == first.keys() == last.keys()
    assert all((kept[k] == first[k]).all() for k in kept)
    assert all((last[k] == ckpt[k]).all() for k in last)  # a validated update's adapter is that update's


def test_keep_best_loads_the_best_update_into_the_learner_not_the_last(make_learner, tmp_path):
    """A real learner: the adapter validated at update 0 scores best, the learner then moves on (its LoRA weights
    change, as an update changes them); keep_best puts update 0's tensors back and leaves the optimizer alone."""
    import torch
    from types import SimpleNamespace

    from bapsql.train.loop.validation import keep_best

    learner = make_learner()
    tasks = [SimpleNamespace(task_id=f"t{i}") for i in range(4)]
    v = Validator(_Rollouts({0: 0.75, 1: 0.25}), learner, tasks, ("XS",), tmp_path)
    v.run(0)
    before = learner.adapter_state()
    with torch.no_grad():
        for name, p in learner.model.named_parameters():
            if "lora_" in name:
                p.add_(0.5)
    v.run(1)
    moved = learner.adapter_state()
    assert any(not torch.equal(before[k], moved[k]) for k in before)
    assert keep_best(v, learner).update == 0
    now = learner.adapter_state()
    assert all(torch.equal(before[k], now[k]) for k in before)
    with pytest.raises(ConfigError, match="adapter_model.safetensors"):
        learner.load_adapter(tmp_path / "nowhere")


def test_each_validation_logs_a_trajectory_table_at_its_update(tmp_path):
    """With a monitor, every validation round logs ``val/trajectories`` at the update's step: up to 2 successes and
    2 failures per level, one row per turn with the completion and observation text."""
    from types import SimpleNamespace

    from bapsql.logs.monitor import MemoryMonitor

    class Rollouts:
        def validate(self, prompts, version):
            out = []
            for p in prompts:
                ok = int(p.task_id[1:]) % 2 == 0  # t0, t2, t4 succeed at every level
                ep = {"episode_id": f"{p.task_id}@{p.level}:{p.seed}", "method": "model.policy.val@full",
                      "budget": p.level, "task_id": p.task_id, "seed": p.seed, "sample": 0, "success": ok,
                      "reward": float(ok)}
                turns = [{"turn": 1, "action": "invalid", "valid": False, "status": None,
                          "completion": f"SELECT * FROM t -- {p.task_id}", "observation": "no tool call found"},
                         {"turn": 2, "action": "answer", "valid": True, "status": None, "completion": "<tool_call>",
                          "observation": "Episode over."}]
                out.append(SimpleNamespace(episode=ep, turns=turns))
            return out

    tasks = [SimpleNamespace(task_id=f"t{i}") for i in range(6)]
    monitor = MemoryMonitor()
    v = Validator(Rollouts(), _Learner(), tasks, ("XS", "S"), tmp_path, monitor=monitor)
    v.run(0)
    v.run(3)
    assert [(name, step) for name, step, _ in monitor.table_log] == [("val/trajectories", 0),
                                                                     ("val/trajectories", 3)]
    rows = monitor.table_log[1][2]
    episodes = {(r["level"], r["episode_id"]): r["success"] for r in rows}
    for lv in ("XS", "S"):
        outcomes = [ok for (level, _), ok in episodes.items() if level == lv]
        assert sorted(outcomes) == [False, False, True, True]
    assert len(rows) == 2 * len(episodes) and {r["turn"] for r in rows} == {1, 2}
    bad = [r for r in rows if r["turn"] == 1]
    assert all(r["completion"].startswith("SELECT * FROM t -- ") and not r["valid"] for r in bad)
