"""The training recipe, stage by stage (DESIGN §5): pretrain → SFT → GRPO → evaluation.

`pipeline` (one call per stage and `run_recipe`, the stages in order in one Ray session), `pretrain` (in-domain
pretraining of the tiny model) with `copy_task` (the synthetic copy task beside it), `sft` (SFT through Ray Train),
`evaluation` (the trained policies' sweep and report), `curves` (learning-curve plots).

May import: `bapsql.train.algo`, `bapsql.train.learner`, `bapsql.train.loop`, the training config, and the layers
below training; not `experiments`.
"""
