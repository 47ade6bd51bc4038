"""Training (DESIGN §5): SFT on the programmatic workflows' turn pairs, then GRPO with LoRA.

Five sub-packages, each importing only the ones above it in this list (`tests/test_structure.py` checks it):

- `algo`: the algorithm's math, pure (numpy / torch tensors in, numbers out): advantages and the clipped loss
  (`grpo`), rewards, the difficulty filter, the staleness gate, the (task, budget) prompt sampler, token logprobs;
- `learner`: the model being trained: the LoRA `Learner` (`learner.core`), its settings, saved state, checkpoints,
  model parts, weight sync to the engines, and the optimizer steps of one GRPO update (`minibatch`);
- `loop`: the GRPO loop: the trainer (`loop.trainer`, synchronous; `loop.overlap`, pipelined), the training
  rollouts, rollout groups → samples (`batch`), GRPO's tasks (`grpo_data`), in-loop validation, and the wiring of
  one GRPO run (`grpo_setup`, `engine_setup`);
- `recipe`: the stages in order (`recipe.pipeline`: pretrain → SFT → GRPO → evaluation), with the pretraining,
  SFT, evaluation and learning-curve code they run;
- `experiments`: studies built on the recipe: Table 2 in miniature (`table2*`) and the headroom measurement.

Here, at the top: the training config every stage reads (`config`: the strict `TrainConfig`, assembled from the
sections `algo` and `learner` own; `extends`: YAML ``extends:`` merging; `pretrain_config`: the ``pretrain:``
section). It sits between `learner` and `loop`: `algo` and `learner` never import it, the others may.

The learner as a Ray actor and Ray Train live in the Ray shell (`bapsql.rollout.ray_shell.learner`, `.train`).
Importing this package or any sub-package imports nothing (every ``__init__`` is a docstring).
"""
