"""`python -m runner.sim serve MODEL ...`, the way the runner's sim backend starts the simulator."""

import sys

from runner.sim.cli import main

sys.exit(main())
