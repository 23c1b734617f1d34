"""Placed like vllm/distributed/: what a stack dump of a simulated rank names."""
