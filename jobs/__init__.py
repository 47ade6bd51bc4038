"""Thin job entrypoints, run as ``python -m jobs.<name>``: parse arguments, call one library function."""
