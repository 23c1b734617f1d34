"""Environment fingerprints: the frozen failure scene, content-addressed so two of them can be diffed."""

from runner.fingerprint.collect import Change, FixedRequest, ImageTarget, PythonTarget, Target, collect
from runner.fingerprint.diff import diff, diff_text
from runner.fingerprint.document import FingerprintError, load_fingerprint, to_text

__all__ = [
    "Change",
    "FingerprintError",
    "FixedRequest",
    "ImageTarget",
    "PythonTarget",
    "Target",
    "collect",
    "diff",
    "diff_text",
    "load_fingerprint",
    "to_text",
]
