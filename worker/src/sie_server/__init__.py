"""Public adapter identifiers of sie-workers (``adapter_path: sie_server.adapters...``)."""

__all__: list[str] = []
