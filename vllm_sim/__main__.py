"""`python -m vllm_sim serve MODEL ...`, the way the runner's sim backend starts the simulator."""

import sys

from vllm_sim.cli import main

sys.exit(main())
