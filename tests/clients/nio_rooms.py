"""Rooms with a real client: matrix-nio user A creates a public room with an alias, B joins by
alias, they exchange messages, A renames the room and sets a topic, B (default power) is
refused when changing power levels, A kicks and bans B, and B cannot rejoin.

Usage: python nio_rooms.py http://127.0.0.1:PORT
"""

import asyncio
import sys
import uuid

from nio import (
    AsyncClient,
    JoinError,
    JoinResponse,
    RoomBanResponse,
    RoomCreateResponse,
    RoomGetEventResponse,
    RoomKickResponse,
    RoomPreset,
    RoomPutStateError,
    RoomPutStateResponse,
    RoomSendResponse,
    RoomVisibility,
)


def check(condition, message):
    if not condition:
        raise SystemExit(f"FAIL: {message}")
    print(f"ok - {message}")


async def new_user(homeserver: str, name: str) -> AsyncClient:
    client = AsyncClient(homeserver, name)
    response = await client.register(name, "secret password", device_name=f"{name}-device")
    check(getattr(response, "access_token", None), f"register {name}")
    return client


async def message_text(reader: AsyncClient, room_id: str, event_id: str) -> str:
    response = await reader.room_get_event(room_id, event_id)
    check(isinstance(response, RoomGetEventResponse), f"{reader.user_id} fetches {event_id}")
    return response.event.body


async def main(homeserver: str) -> None:
    suffix = uuid.uuid4().hex[:6]
    alice = await new_user(homeserver, f"alice{suffix}")
    bob = await new_user(homeserver, f"bob{suffix}")
    alias = f"lobby{suffix}"

    created = await alice.room_create(
        visibility=RoomVisibility.public, alias=alias, name="Lobby", topic="Say hi", preset=RoomPreset.public_chat
    )
    check(isinstance(created, RoomCreateResponse), f"alice creates a public room: {type(created).__name__}")
    room_id = created.room_id
    # The alias is on the server's own name, which may carry a port; a localpart has no colon.
    server_name = alice.user_id.split(":", 1)[1]

    joined = await bob.join(f"#{alias}:{server_name}")
    check(isinstance(joined, JoinResponse) and joined.room_id == room_id, f"bob joins by alias: {joined}")

    hello = await alice.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": "hello bob"})
    check(isinstance(hello, RoomSendResponse), "alice sends a message")
    check(await message_text(bob, room_id, hello.event_id) == "hello bob", "bob reads alice's message")
    reply = await bob.room_send(room_id, "m.room.message", {"msgtype": "m.text", "body": "hi alice"})
    check(isinstance(reply, RoomSendResponse), "bob replies")
    check(await message_text(alice, room_id, reply.event_id) == "hi alice", "alice reads bob's reply")

    renamed = await alice.room_put_state(room_id, "m.room.name", {"name": "Renamed lobby"})
    check(isinstance(renamed, RoomPutStateResponse), "alice renames the room")
    topic = await alice.room_put_state(room_id, "m.room.topic", {"topic": "New topic"})
    check(isinstance(topic, RoomPutStateResponse), "alice changes the topic")

    power = await bob.room_put_state(room_id, "m.room.power_levels", {"users": {bob.user_id: 100}})
    check(isinstance(power, RoomPutStateError) and power.status_code == "M_FORBIDDEN", "bob may not change power levels")

    kicked = await alice.room_kick(room_id, bob.user_id, reason="cool down")
    check(isinstance(kicked, RoomKickResponse), "alice kicks bob")
    rejoined = await bob.join(room_id)
    check(isinstance(rejoined, JoinResponse), "a kicked user may rejoin a public room")
    banned = await alice.room_ban(room_id, bob.user_id, reason="enough")
    check(isinstance(banned, RoomBanResponse), "alice bans bob")
    refused = await bob.join(f"#{alias}:{server_name}")
    check(isinstance(refused, JoinError) and refused.status_code == "M_FORBIDDEN", "a banned user cannot rejoin")

    await alice.close()
    await bob.close()
    print("nio rooms: 1 passed, 0 failed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
