"""bapsql.env"""
