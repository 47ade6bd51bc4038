"""A real learning signal: GRPO on a toy task raises the rewarded action's probability on the tiny model.

The policy's action is how it opens its turn after a fixed chat prompt (its first sampled token); the rewarded
action is opening with ``<tool_call>`` (probability ~0.1 under the briefly pretrained tiny model, next to ``{"`` and
``You``). Each update samples groups from the HF engine serving the current adapter (seeded), rewards them,
computes group advantages, takes one GRPO step on the learner and syncs the adapter back to the engine (with the
logprob check). The exact probability of the rewarded action, from the learner's next-token distribution, must rise
clearly within a few updates.
"""

import numpy as np
import pytest

from bapsql.train.algo.grpo import LossConfig, group_advantages
from bapsql.train.learner.core import Sample
from bapsql.train.learner.weight_sync import SyncSection, WeightSync, make_probe

torch = pytest.importorskip("torch")


def action_probability(learner, prompt, token):
    with torch.no_grad():
        logits = learner.model(input_ids=torch.tensor([prompt])).logits[0, -1].float()
    return float(torch.softmax(logits, dim=-1)[token])


@pytest.mark.slow
def test_grpo_raises_the_rewarded_actions_probability(make_learner, pretrained_tiny_dir, tmp_path):
    from bapsql.models.chat_template import ChatTemplate
    from bapsql.rollout.engines.base import EngineConfig, SamplingParams
    from bapsql.rollout.engines.hf import HFEngine

    template = ChatTemplate.from_dir(pretrained_tiny_dir)
    action = template.tokenizer.token_to_id("<tool_call>")
    prompt = template.apply([{"role": "user", "content": "How many orders were placed?"}],
                            add_generation_prompt=True)
    engine = HFEngine(EngineConfig(kind="hf", model=str(pretrained_tiny_dir), dtype="float32", device="cpu",
                                   num_threads=1, max_model_len=1024))
    learner = make_learner(lr=1e-3, model_path=pretrained_tiny_dir)
    sync = WeightSync(engine, learner, make_probe(template), tmp_path / "adapters",
                      settings=SyncSection(tolerance=1e-3))
    sync.sync(0)
    groups, size = 4, 8
    history = [action_probability(learner, prompt, action)]
    for update in range(8):
        params = [SamplingParams(max_tokens=1, temperature=1.0, seed=1000 * update + i) for i in range(groups * size)]
        gens = engine.generate([prompt] * len(params), params, adapter=sync.adapter)
        rewards = np.array([float(g.completion_ids[0] == action) for g in gens])
        adv = group_advantages(rewards, np.repeat(np.arange(groups), size))
        samples = [Sample(tuple(prompt) + g.completion_ids, (0,) * len(prompt) + (1,),
                          (0.0,) * len(prompt) + g.logprobs, float(a)) for g, a in zip(gens, adv)]
        metrics = learner.grpo_update(samples, LossConfig())
        assert metrics.stats.mismatch / metrics.stats.tokens < 1e-4  # engine and learner agree (float32)
        sync.sync(update + 1)
        history.append(action_probability(learner, prompt, action))
    engine.close()
    assert 0.02 < history[0] < 0.3, history
    assert history[-1] > 1.5 * history[0], history
    assert sum(b > a for a, b in zip(history, history[1:])) >= 6, history  # it rises update after update
