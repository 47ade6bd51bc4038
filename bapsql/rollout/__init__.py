"""Rollouts: the in-process runner (`bapsql.rollout.runner`: evaluation sweeps of one policy, Parquet logs), model
engines, the agent loop, the sweep's checks (`bapsql.rollout.completion_cap`: gold answers longer than a turn's new
tokens) and the Ray shell. Importing the package imports none of them."""
