# PYTHON_ARGCOMPLETE_OK
"""`python -m hub.cli …`: the `amux` command line, as the console script runs it."""
import sys

from .amux import main

sys.exit(main())
