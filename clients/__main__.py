"""`python -m clients` runs the ragrpc CLI (same as `python -m clients.cli`)."""

import sys

from clients.cli import main

sys.exit(main())
