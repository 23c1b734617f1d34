"""Collecting an environment fingerprint on the GPU host: the frozen failure scene (documents: kernel/fingerprint)."""

from runner.fingerprint.collect import Change, FixedRequest, ImageTarget, PythonTarget, Target, collect

__all__ = ["Change", "FixedRequest", "ImageTarget", "PythonTarget", "Target", "collect"]
