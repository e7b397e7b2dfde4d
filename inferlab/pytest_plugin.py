"""The pytest11 entry point's name: this module is `inferlab.suite.pytest_plugin` itself.

Replacing the module object (not re-exporting its names) keeps one plugin registered when both
the entry point and a conftest's `pytest_plugins` name it.
"""

import importlib
import sys

sys.modules[__name__] = importlib.import_module("inferlab.suite.pytest_plugin")
