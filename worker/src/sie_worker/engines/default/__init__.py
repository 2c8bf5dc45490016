"""The default engine (``python -m sie_worker.engines.transformers``) as the worker launches
it: its family (:mod:`.family`) and argv (:mod:`.argv`)."""
