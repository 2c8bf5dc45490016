"""``python -m sie_worker.engines.transformers``: the default engine's process."""

import os
import sys

from sie_worker.engines.transformers import main

code = main()
sys.stdout.flush()
sys.stderr.flush()
# why: a model load or generation still running on the model thread must not delay the
# exit after SIGTERM (interpreter shutdown would join that thread)
os._exit(code)
