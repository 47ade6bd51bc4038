"""bapsql.policies"""
