"""The learner: the model being trained and everything that touches its weights.

`core` (`Learner`: a causal LM with a LoRA adapter taking SFT and GRPO steps; `Sample`, `UpdateMetrics`), `config`
(`LearnerConfig`, `OptimConfig`, `LoraSpec`), `state` (saving and loading the adapter, optimizer and RNG state, the
merged folder), `checkpoint` (checkpoint folders that resume exactly), `model_parts` (LoRA targets, dropouts,
weight files), `weight_sync` (pushing the adapter to the engines and checking they serve it), `minibatch` (the PPO
epochs × mini-batches of one GRPO update on a learner).

May import: `bapsql.train.algo`, and below `bapsql.train` (errors, models, the engines' adapter digest); not the
training config (`bapsql.train.config` imports this package's settings) nor `loop`, `recipe`, `experiments`.
"""
