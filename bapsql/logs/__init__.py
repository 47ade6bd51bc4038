"""Trajectory logs: a versioned Parquet schema, an atomic writer, a reader, and run monitors (W&B / null).

Imports nothing above `bapsql.types` so that the analysis job can read logs from any version or any other system.
"""
