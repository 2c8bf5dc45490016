"""ASGI middleware of the worker and the router, one concern per module."""

from sie_worker.middleware.auth import BearerAuth
from sie_worker.middleware.body_limit import BodyLimit

__all__ = ["BearerAuth", "BodyLimit"]
