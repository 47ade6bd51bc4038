"""bapsql.data"""
