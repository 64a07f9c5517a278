"""``python -m monitor.commands``: the ``draftwatch`` entry point, for subprocesses and checkouts."""

import sys

from monitor.commands.main import main

sys.exit(main())
