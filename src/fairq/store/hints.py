"""Wake-up hints: the pub/sub channel scripts publish on when work may be available.

Scripts publish ``work`` (a queue's head changed: a new run, an earlier one), ``limits``
(a limit was raised or a queue resumed), and ``cancel:<env>:<run>`` (a running run was
asked to stop). A :class:`HintSubscription` yields them; it resubscribes by itself after
a lost connection (with bounded backoff), and yields ``""`` every time it (re)subscribes,
since anything may have happened while it was away.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Final

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

if TYPE_CHECKING:
    from fairq.store._core import StoreCore

log = logging.getLogger("fairq.hints")

#: Backoff bounds for resubscribing (s).
MIN_BACKOFF_S: Final = 0.05
MAX_BACKOFF_S: Final = 2.0


def _auth(client: RedisCluster) -> dict[str, Any]:
    kwargs: dict[str, Any] = getattr(client.get_default_node(), "connection_kwargs", {}) or {}
    return {k: kwargs[k] for k in ("username", "password") if k in kwargs}


class HintSubscription:
    """Yields wake-up hints of one store's prefix until closed."""

    def __init__(self, store: StoreCore) -> None:
        self.store = store
        self.closed = False
        self._client: Any = None

    def _source(self) -> Any:
        client = self.store.client
        if isinstance(client, RedisCluster):
            # Classic PUBLISH is broadcast to every node of a cluster: any node will do.
            node = client.get_default_node()
            return aioredis.Redis(host=node.host, port=int(node.port), **_auth(client))
        return client

    async def messages(self) -> AsyncGenerator[str, None]:
        backoff = MIN_BACKOFF_S
        while not self.closed:
            try:
                self._client = self._source()
                pubsub = self._client.pubsub(ignore_subscribe_messages=True)
                async with pubsub:
                    await pubsub.subscribe(self.store.keys.wake_channel)
                    backoff = MIN_BACKOFF_S
                    yield ""
                    while not self.closed:
                        message = await pubsub.get_message(timeout=None)
                        if message is not None:
                            data = message.get("data", b"")
                            # anyone may publish here: bytes that are not UTF-8 are
                            # no hint fairq sends, and must not end the subscription
                            yield (
                                data.decode(errors="replace")
                                if isinstance(data, bytes)
                                else str(data)
                            )
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                if self.closed:
                    return
                log.warning(
                    "wake-up subscription to %s lost (%s); retrying in %.2fs",
                    self.store.server, exc, backoff,
                )  # fmt: skip
                yield ""
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MAX_BACKOFF_S)

    async def close(self) -> None:
        self.closed = True
        if self._client is not None and self._client is not self.store.client:
            with contextlib.suppress(RedisError, OSError):
                await self._client.aclose()
