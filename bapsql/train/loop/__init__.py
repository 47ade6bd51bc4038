"""The GRPO loop: budget sampling → rollouts → filter → learner → weight sync → checkpoint, once per update.

`trainer` (`GRPOTrainer`, synchronous), `overlap` (the pipelined trainer, ``grpo.max_staleness`` ≥ 1, and
`make_trainer`), `rollouts` (`TrainingRollouts`: the rollout actors and engines as the loop drives them), `batch`
(rollout groups → learner samples), `grpo_data` (GRPO's prompt and validation tasks), `validation` (in-loop
validation and keeping the best update), `grpo_setup` (one GRPO run's parts wired from the training config),
`engine_setup` (a stage's rollout engine config).

May import: `bapsql.train.algo`, `bapsql.train.learner`, the training config (`bapsql.train.config`), and the
layers below training (rollout, env, data, logs); not `recipe` or `experiments`.
"""
