"""`python -m jaxpos.cli`: the `jaxpos` command."""

import sys

from jaxpos.cli import main

sys.exit(main())
