"""`k3repro demo`: the embedded demo wires the three products together on one machine — a runner daemon with the
simulator's engine backend and the bot's core over mTLS on loopback. It sits above them all (as the tests do):
no product imports it; the terminal's command registry names it (bot/operations.py)."""
