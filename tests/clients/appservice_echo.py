"""A real application service against a running homeserver: mautrix-python's AppService
pings the server, its bot joins a room when invited (the invite comes in a transaction), a
ghost it registers (m.login.application_service) joins through the bot's invite and echoes
each message with a massaged timestamp (?ts=), and typing arrives as an ephemeral event.

Usage: python appservice_echo.py http://127.0.0.1:PORT
Environment: AS_TOKEN, HS_TOKEN (the registration's tokens), HS_NAME (the server name),
AS_PORT (where the appservice listens; the registration's url). The registration (id "echo",
sender_localpart "echobot", users '@echo_.*:HS_NAME' exclusive, receive_ephemeral true)
is the one tests/run.sh writes; the same file works with Synapse's app_service_config_files.
"""

import asyncio
import os
import sys
import tempfile
import time

import aiohttp
from mautrix.appservice import AppService
from mautrix.appservice.state_store import FileASStateStore
from mautrix.types import EventType, Membership, MessageType, TextMessageEventContent


def check(condition, message):
    if not condition:
        raise SystemExit(f"FAIL: {message}")
    print(f"ok - {message}")


async def main(homeserver: str) -> None:
    name = os.environ.get("HS_NAME", "localhost")
    bot, ghost = f"@echobot:{name}", f"@echo_alice:{name}"
    store = FileASStateStore(tempfile.mktemp(suffix=".json"), binary=False)
    appserv = AppService(
        server=homeserver, domain=name, as_token=os.environ["AS_TOKEN"],
        hs_token=os.environ["HS_TOKEN"], bot_localpart="echobot", id="echo",
        ephemeral_events=True, state_store=store,
    )
    typing_seen = asyncio.Event()

    @appserv.matrix_event_handler
    async def on_event(evt) -> None:
        if (evt.type == EventType.ROOM_MEMBER and evt.state_key == bot
                and evt.content.membership == Membership.INVITE):
            await appserv.intent.ensure_joined(evt.room_id)
        elif evt.type == EventType.ROOM_MESSAGE and not evt.sender.startswith(("@echo", bot)):
            # Registers the ghost and joins it (through the bot's invite: it may not join alone).
            intent = appserv.intent.user(ghost)
            await intent.send_message_event(
                evt.room_id, EventType.ROOM_MESSAGE, timestamp=evt.timestamp - 1000,
                content=TextMessageEventContent(msgtype=MessageType.TEXT,
                                                body="echo: " + evt.content.body))
        elif evt.type == EventType.TYPING and evt.content.user_ids:
            typing_seen.set()

    await appserv.start(host="127.0.0.1", port=int(os.environ.get("AS_PORT", "29333")))
    try:
        check(await appserv.intent.appservice_ping("echo", "t1") >= 0,
              "ping: the homeserver reached the appservice")
        check((await appserv.intent.whoami()).user_id == bot, "whoami as the bot (?user_id=)")
        async with aiohttp.ClientSession() as http:
            async def call(method, path, token=None, **kw):
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                async with http.request(method, homeserver + "/_matrix/client/v3" + path,
                                        headers=headers, **kw) as r:
                    body = await r.json()
                    assert r.status == 200, (path, r.status, body)
                    return body

            alice = await call("POST", "/register", json={
                "username": f"alice{int(time.time() * 1000)}", "password": "pw-pw-pw-1",
                "auth": {"type": "m.login.dummy"}})
            tok = alice["access_token"]
            room = (await call("POST", "/createRoom", tok, json={"invite": [bot]}))["room_id"]
            since = (await call("GET", "/sync?timeout=0", tok))["next_batch"]
            for _ in range(100):  # the bot joins when the invite's transaction arrives
                members = await call("GET", f"/rooms/{room}/joined_members", tok)
                if bot in members["joined"]:
                    break
                await asyncio.sleep(0.1)
            check(bot in members["joined"], "the bot joined on the invite it was sent")
            await call("PUT", f"/rooms/{room}/typing/{alice['user_id']}", tok,
                       json={"typing": True, "timeout": 5000})
            sent = await call("PUT", f"/rooms/{room}/send/m.room.message/t{time.time()}", tok,
                              json={"msgtype": "m.text", "body": "hello"})
            seen = {}
            for _ in range(20):  # long-poll until the ghost's echo arrives
                resp = await call("GET", f"/sync?timeout=3000&since={since}", tok)
                since = resp["next_batch"]
                timeline = resp.get("rooms", {}).get("join", {}).get(room, {}).get("timeline", {})
                for e in timeline.get("events", []):
                    seen[e["content"].get("body")] = e
                if "echo: hello" in seen:
                    break
            check("echo: hello" in seen, "the ghost echoed the message")
            echo, hello = seen["echo: hello"], seen["hello"]
            check(echo["sender"] == ghost and hello["event_id"] == sent["event_id"],
                  "the echo comes from the ghost, after the message")
            check(echo["origin_server_ts"] == hello["origin_server_ts"] - 1000,
                  "the ghost's timestamp was massaged (?ts=)")
            await asyncio.wait_for(typing_seen.wait(), 10)
            check(True, "typing arrived as an ephemeral event")
    finally:
        await appserv.stop()
    print("appservice echo: all checks passed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1].rstrip("/")))
