"""The gateway (``sie-worker gateway``): one front door for every pool x bundle.

- ``app``: wires the HTTP app; ``routes``: its endpoints; ``service``: its running state
- ``choice``: which pools may serve a request; ``routing``: holding, per-try accounting
- ``policy``: the pure replica decision; ``state``: pods, polls, in-flight counts
- ``discovery``: EndpointSlices (cluster) or the pools file (local); ``pools``: that file
- ``catalogue``: which pools can serve a model; ``health``: cluster health and merged lists
- ``settings``, ``metrics``
"""
