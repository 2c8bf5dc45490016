"""HTTP pieces shared by the worker, the slot router and the gateway.

- ``splice``: a streamed answer from its upstream socket to the client's (the hot path)
- ``wire``: the client's connection, written to directly (uvicorn's internals, pinned)
- ``deadlines``: a request's timeouts, as data; ``relay``: relay one request to a backend
  a route picks (router and gateway); ``fan_out``: one call to several backends at once
- ``request``: read a request's body and model; ``errors``: the one error renderer
- ``front_door``: the app class every server uses: request ids, head and body size
  limits and bearer auth before any route runs
- ``poll``
"""
