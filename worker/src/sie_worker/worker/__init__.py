"""The worker process (``sie-worker serve``): one model per contiguous block of its devices.

- ``app``: the HTTP app (routes, middleware, the error handler)
- ``manager``: model lifecycle (loads, evictions, pins, drains, crashes); ``records`` its state
- ``allocator``: pure placement and eviction choice
- ``launch``: pure engine command lines and environments; ``ports`` picks their ports
- ``engine_process``: start, watch and stop one engine subprocess
- ``proxy``: relay a request to an engine and its answer back
- ``config_store``: the Config API's files; ``metrics``, ``openapi``
"""
