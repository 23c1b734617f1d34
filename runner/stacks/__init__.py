"""Stacks of a stalled engine: py-spy dumps of its processes (dump.py) and where each waits (summary.py)."""
