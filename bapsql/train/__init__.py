"""bapsql.train"""
