"""``python -m inferlab ...``: the ``inferlab`` command, for a checkout that is not installed."""

import sys

from inferlab.cli import main

sys.exit(main())
