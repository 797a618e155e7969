"""``python -m fsm_agent``: the command line, implemented in :mod:`fsm_agent.cli.main`."""

import sys

from fsm_agent.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
