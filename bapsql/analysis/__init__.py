"""bapsql.analysis"""
