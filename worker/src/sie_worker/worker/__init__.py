"""The worker process (``sie-worker serve``): one model per contiguous block of its devices.

- ``app``: the HTTP app; ``request`` reads a request (payload, served model, task)
- ``manager``: model lifecycle (loads, evictions, pins, drains, crashes); ``records`` its
  state and the leases requests hold; ``pin_keeper`` keeps pinned models loaded
- ``allocator``: pure placement and eviction choice
- ``launch``: pure engine command lines and environments; ``ports`` picks their ports
- ``engine_start`` (ports booked, started, ready), ``engine_process`` (one subprocess),
  ``engine_stops`` (drained and stopped in the background)
- ``proxy``: relay a request to an engine and its answer back
- ``config_store``: the Config API's files; ``metrics``, ``openapi``
"""
