"""bapsql.rollout"""
