"""``python -m unifiedplayers.capacity experiment=NAME [overrides] [--gpus 8 ...]``: the plan printed, and checked
against the machine given (:mod:`unifiedplayers.capacity.report`)."""
import sys

from unifiedplayers.capacity.report import main

sys.exit(main())
