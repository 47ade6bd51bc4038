"""bapsql.db"""
