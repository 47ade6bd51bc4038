"""Training (DESIGN §5): SFT on the programmatic workflows' turn pairs, then GRPO with LoRA.

Pure parts: `reward` (BAP-SQL reward and its variants), `grpo` (advantages, clipped token-level loss), `filter`
(online difficulty filter), `sampler` (training-time task × budget prompts), `batch` (groups → samples).
Torch parts (imported lazily): `learner` (LoRA learner), `checkpoint`, `weight_sync`, `sft` (Ray Train).
Orchestration: `rollouts` (actors + driver for training), `loop` (the GRPO update loop), `pipeline` (stages),
`config` (strict `TrainConfig`; `learner_config`, `extends`), `validation` (in-loop validation) and `headroom`
(what sampling solves that greedy decoding does not); the learner as a Ray actor and Ray Train live in the Ray shell
(`bapsql.rollout.ray_shell.learner`, `.train`). Importing this package imports
nothing heavy.
"""
