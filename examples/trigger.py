"""Trigger runs of examples/app.py and wait for their results (run a worker first)."""

from __future__ import annotations

import asyncio

from app import app, make_thumbnail, send_email

from fairq import TriggerItem


async def main() -> None:
    # one run, tenant "globex"
    handle = await send_email.trigger({"to": "ceo@globex.example"}, concurrency_key="globex")
    print("e-mail:", await handle.wait(timeout=30))

    # a batch: a noisy tenant and a quiet one share the queue fairly
    noisy = [
        TriggerItem({"to": f"user{i}@initech.example"}, concurrency_key="initech")
        for i in range(20)
    ]
    quiet = [TriggerItem({"to": "ops@hooli.example"}, concurrency_key="hooli")]
    handles = await send_email.trigger_many(noisy + quiet)
    results = [await h.wait(timeout=60) for h in handles]
    print(f"batch: {len(results)} e-mails sent")

    # a run that fails for good, and a delayed one
    bad = await send_email.trigger({"to": "nobody"}, concurrency_key="globex")
    try:
        await bad.wait(timeout=30)
    except Exception as exc:  # RunFailedError
        print("failed as expected:", exc)
    later = await make_thumbnail.trigger({"image": "cat.jpg"}, delay=1.0)
    print("thumbnail:", await later.wait(timeout=30))
    print("status:", await app.get_run(later.run_id))
    await app.aclose()


def blocking_caller() -> None:
    """The same from code that is not async."""
    handle = make_thumbnail.trigger_sync({"image": "dog.jpg"})
    print("sync thumbnail:", handle.wait_sync(timeout=30))
    app.close()


if __name__ == "__main__":
    asyncio.run(main())
    blocking_caller()
