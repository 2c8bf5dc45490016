"""HTTP pieces shared by the worker, the slot router and the gateway.

- ``stream_client``: one streamed response over its own connection (the streaming hot path)
- ``relay``: relay one request to a backend a route picks (router and gateway)
- ``request``: read a request's body and model; ``errors``: the one error renderer
- ``auth``: bearer-token middleware; ``body_limit``: request body size limit
"""
