"""`python -m maibot`: the same as the `maibot` command (maibot.cli)."""

import sys

from maibot.cli import main

sys.exit(main())
