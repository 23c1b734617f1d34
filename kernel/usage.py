"""The one refusal a terminal command ends with on bad input, whichever product's handler raised it."""


class CommandError(Exception):
    """Printed as `k3repro: <message>` with exit code 2; nothing was changed."""
