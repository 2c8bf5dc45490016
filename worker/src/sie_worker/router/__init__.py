"""The pod's slot router (``sie-worker route``): one endpoint in front of the pod's workers.

- ``app``: the HTTP app; ``request`` reads what a client request names
- ``policy``: the pure routing decision; ``state`` polls the slots and keeps their state
- ``relay``: relay one request to the chosen slot; ``merge``: merged views of the slots
- ``settings``, ``metrics``
"""
