"""The one refusal: a request that changed nothing but, at most, its audit line, said in one line.

Operations raise it; Slack answers it ephemerally and the terminal prints it (exit 2), so neither front-end
needs to know which check refused.
"""

from __future__ import annotations


class Refused(Exception):
    """Bad cluster, bad launch command or note, an active run, no runner, a runner that refused the run,
    a user or channel not allowed."""
