"""Placed like vllm/distributed/device_communicators/."""
