"""``python -m leasehold`` runs the command line (see ``leasehold.cli``)."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
