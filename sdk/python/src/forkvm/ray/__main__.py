"""``python -m forkvm.ray up|start|down|status``: see :mod:`forkvm.ray._cli`."""

import sys

from ._cli import main

sys.exit(main())
