"""Host tools of the GPU host (`k3repro fingerprint`, `k3repro check`): they read this host's scene, so they are
the runner's; the terminal's command registry (bot/operations.py) names them and loads them only when run."""
