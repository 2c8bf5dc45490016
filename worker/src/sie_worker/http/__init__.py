"""HTTP pieces shared by the worker, the slot router and the gateway.

- ``stream_client``: one streamed response over its own connection (the streaming hot path)
- ``auth``: bearer-token middleware; ``body_limit``: request body size limit
"""
