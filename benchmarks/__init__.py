"""Benchmarks of swinexp on the machine at hand: `python -m benchmarks [step] [peers] [data] [overhead]`.

Each sub-benchmark prints a markdown table (median, min and max over the timed iterations) and can log it to MLflow.
Importing this package imports nothing heavy; the CLI is in `__main__`.
"""
