"""Environment fingerprints as documents: content-addressed, loaded, diffed and rendered. Both sides read them
(the bot's `diff`, `check` and rerun comparison); only the runner collects one (runner/fingerprint)."""

from kernel.fingerprint.diff import diff, diff_text
from kernel.fingerprint.document import FingerprintError, load_fingerprint, to_text

__all__ = ["FingerprintError", "diff", "diff_text", "load_fingerprint", "to_text"]
