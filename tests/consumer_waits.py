"""Knowing when a consumer has gone to sleep, without guessing how long it takes."""

from __future__ import annotations

import asyncio

from fairq.consumer import Consumer


def noting_its_wait(consumer: Consumer) -> asyncio.Event:
    """An event set each time ``consumer`` starts to wait for a hint: its maintenance and
    the dequeue that found nothing are done (a fixed sleep races them on a slow machine)."""
    asleep = asyncio.Event()
    wait_for_hint = consumer.wait_for_hint

    async def noting(wait: float) -> None:
        asleep.set()
        await wait_for_hint(wait)

    consumer.wait_for_hint = noting  # type: ignore[method-assign]
    return asleep


async def subscribed(consumer: Consumer) -> Consumer:
    """Start ``consumer`` and return once its listener is subscribed: its subscription's
    first hint ("") has set its wake-up event. (A hint still to come would end a wait
    early, and one published before it would be lost.)"""
    await consumer.start()
    await asyncio.wait_for(consumer._wake.wait(), 10)
    return consumer
