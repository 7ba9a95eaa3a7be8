"""/sync with a real client: matrix-nio's sync loop receives a live message, and scrolling
back with room_messages from the timeline's prev_batch returns 200 messages with no gap or
duplicate.

Usage: python nio_sync.py http://127.0.0.1:PORT
"""

import asyncio
import sys
import uuid

from nio import AsyncClient, MessageDirection, RoomMessagesResponse, RoomMessageText, SyncResponse


def check(condition, message):
    if not condition:
        raise SystemExit(f"FAIL: {message}")
    print(f"ok - {message}")


async def main(homeserver: str) -> None:
    suffix = uuid.uuid4().hex[:6]
    alice = AsyncClient(homeserver, f"alice{suffix}")
    bob = AsyncClient(homeserver, f"bob{suffix}")
    check(getattr(await alice.register(f"alice{suffix}", "pw"), "access_token", None), "register alice")
    check(getattr(await bob.register(f"bob{suffix}", "pw"), "access_token", None), "register bob")
    room_id = (await alice.room_create(preset=None)).room_id
    await alice.room_invite(room_id, bob.user_id)
    await bob.join(room_id)
    for n in range(200):
        await alice.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": f"msg {n}"})

    first = await bob.sync(timeout=0, full_state=True)
    check(isinstance(first, SyncResponse), "bob's initial sync")
    check(room_id in bob.rooms, "the room is in bob's client state")
    prev_batch = first.rooms.join[room_id].timeline.prev_batch
    recent = [e.body for e in first.rooms.join[room_id].timeline.events if isinstance(e, RoomMessageText)]

    live = asyncio.create_task(bob.sync(timeout=10_000, since=first.next_batch))
    await asyncio.sleep(0.3)
    await alice.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": "live message"})
    delta = await live
    bodies = [e.body for e in delta.rooms.join[room_id].timeline.events if isinstance(e, RoomMessageText)]
    check(bodies == ["live message"], f"the long-poll delivers the live message: {bodies}")

    older = []
    token = prev_batch
    while token:
        page = await bob.room_messages(room_id, start=token, limit=40, direction=MessageDirection.back)
        check(isinstance(page, RoomMessagesResponse), f"a page of history ({len(older)} so far)")
        older.extend(e.body for e in page.chunk if isinstance(e, RoomMessageText))
        token = page.end if page.chunk else None
    history = list(reversed(older)) + recent
    check(history == [f"msg {n}" for n in range(200)], "scrolling back returns every message once, in order")

    await alice.close()
    await bob.close()
    print("nio sync: 1 passed, 0 failed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
