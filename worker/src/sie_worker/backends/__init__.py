"""What the slot router and the gateway both keep of the servers they route to.

One poll reader (:mod:`.answers`: a worker's or a pod router's ``/v1/models``,
``/v1/devices`` and ``/readyz`` read into one shape), one backend record with its dispatch,
poll and mark-down rules and its poll loop (:mod:`.table`), and the prompt-prefix index both
route by (:mod:`.prefix`). The policies stay apart: ``router/policy.py`` and
``gateway/policy.py``.
"""
