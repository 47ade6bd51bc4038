"""Rollouts: the in-process runner (`bapsql.rollout.runner`: evaluation sweeps of one policy, Parquet logs), model
engines, the agent loop and the Ray shell. Importing the package imports none of them."""
