"""Cluster slots on a Redis-compatible server: the ``redis`` extra.

::

    from trio_taskvisor.redis import RedisSlotStore

    store = RedisSlotStore("redis://127.0.0.1:6379/0", namespace="billing", lease_ttl=10.0)
    config = SupervisorConfig(controller=ControllerConfig(slot_store=store))

Importing this module without the extra (``pip install 'trio_taskvisor[redis]'``, which
brings coredis, a client that runs natively under trio) raises ``ImportError``.
"""

try:
    from . import _redis_client  # the adapter: the one module that imports coredis
except ImportError as exc:
    raise ImportError(
        "trio_taskvisor.redis needs the redis extra: pip install 'trio_taskvisor[redis]'"
    ) from exc

from ._config import RedisSlotStore as RedisSlotStore

del _redis_client

__all__ = ["RedisSlotStore"]
