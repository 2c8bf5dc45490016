"""The worker process (``sie-worker serve``): the models of one container and their engines.

- ``app``: the HTTP app; ``inference`` the one inference path; ``request`` reads a request
  (payload, served model, task); ``proxy`` relays it to an engine and the answer back
- ``manager``: model lifecycle (loads, evictions, pins, drains, crashes); ``records`` its
  state and the leases requests hold; ``pin_keeper`` keeps pinned models loaded
- ``placement/``: the pure allocator (which devices a model gets, whom it evicts)
- ``launcher/``: engine processes: the pure launch plan, ports, start, stops
- ``weights/``: the Hugging Face cache, downloads, and the download step of a load
- ``config_store``: the Config API's files; ``metrics``, ``openapi``
"""
