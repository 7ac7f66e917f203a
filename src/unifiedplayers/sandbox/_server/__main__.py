"""Run by path: ``python -P -s -S <this folder>``. The folder's parent goes first on ``sys.path`` (in the place of the
folder itself), so that the server's modules import each other as the package ``_server``; the calls' own
``sys.path`` is the standard library only (:func:`_server.forker.cell_main`)."""
import os
import sys

sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import _server.preload  # noqa: E402,F401 - first: random's after-fork hook (see there)
from _server.dispatch import main  # noqa: E402

main()
