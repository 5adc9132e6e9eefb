"""``python -m raftwal.cli``: the same as the ``raftwal`` console script."""

import sys

from raftwal.cli.main import main

sys.exit(main())
