"""`python -m harnesslab.servers` is the `harnesslab` command."""

import sys

from .cli import main

sys.exit(main())
