#!/usr/bin/env python3
"""Federation interop checks between two homeservers, driven through their client APIs.

    FED_CA=ca.pem interop.py A_CLIENT_URL A_SERVER_NAME B_CLIENT_URL B_SERVER_NAME

Registers one user on each homeserver (A and B) and checks, in both directions, that what one
side's user does is seen by the other side's user. The driver talks only to each side's own
client-server API (plain HTTP), so everything that passes between the users crosses
federation. Only the `version` and `server_keys` checks talk to a federation port directly,
over TLS, trusting the CA in the file named by the FED_CA environment variable.

Prints one line per check, `ok NAME ...` or `FAIL NAME: why`, then `N passed, N failed`,
and exits 1 when any check failed (2 on bad arguments). `X->Y` in a name means that what
the user on X did is looked for on Y.

Needs signedjson, PyNaCl and requests (tests/federation/requirements-synapse.txt pins them).
Every address involved must be a loopback one: the driver refuses anything else.
"""

import ipaddress
import json
import os
import secrets
import socket
import sys
import time
import urllib.parse

import nacl.public
import requests
from signedjson.key import (
    decode_verify_key_bytes,
    encode_verify_key_base64,
    generate_signing_key,
    get_verify_key,
)
from signedjson.sign import SignatureVerifyException, sign_json, verify_signed_json
from unpaddedbase64 import decode_base64, encode_base64

HTTP_TIMEOUT = 30  # seconds, for any one request
EVENTUAL_TIMEOUT = 15  # seconds to wait for a remote answer that may come from a cache
SYNC_WAIT = 30  # seconds to wait for something to arrive in /sync
SYNC_POLL_MS = 5000  # long-poll timeout of each /sync request
BACKFILL_MESSAGES = 30  # messages sent before the join in the backfill check
# Synapse keeps a remote server's public room list for 30 s (RoomListHandler's
# remote_response_cache), so a list fetched before publication may hide the room that long.
PUBLIC_ROOMS_WAIT = 40

OTK_ALGORITHM = "signed_curve25519"
TO_DEVICE_TYPE = "org.myelin.interop.test"


class CheckFailed(Exception):
    """A check's expectation was not met; the message says why."""


class HttpError(CheckFailed):
    """A request answered with something other than 200."""

    def __init__(self, method, url, status, body):
        super().__init__(f"{method} {url} -> {status}: {str(body)[:300]}")
        self.status = status
        self.body = body


def request(method, url, *, token=None, body=None, params=None, verify=True, timeout=HTTP_TIMEOUT):
    """Sends one request and returns (status, decoded JSON body, or text when not JSON)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    resp = requests.request(
        method, url, headers=headers, json=body, params=params, verify=verify, timeout=timeout
    )
    try:
        return resp.status_code, resp.json()
    except ValueError:
        return resp.status_code, resp.text


def expect_200(method, url, **kwargs):
    """Like request(), but returns only the body and raises HttpError unless the status is 200."""
    status, data = request(method, url, **kwargs)
    if status != 200:
        raise HttpError(method, url, status, data)
    return data


# Retries of the check being run, counted by eventually() and reported by Report.run().
_retries = 0


def eventually(probe, timeout=EVENTUAL_TIMEOUT, interval=0.5):
    """Calls probe() until it returns without raising CheckFailed, for at most timeout seconds.

    Remote answers can lag: a server may answer from a cache (device lists, room lists) or
    not have processed a federation transaction yet. Returns probe()'s result; after the
    timeout, raises its last failure."""
    global _retries
    deadline = time.monotonic() + timeout
    while True:
        try:
            return probe()
        except CheckFailed:
            if time.monotonic() >= deadline:
                raise
        _retries += 1
        time.sleep(interval)


def federation_url(server_name):
    """The federation base URL of a server name, without .well-known or SRV discovery (which
    loopback tests do not use): the explicit port, or 8448."""
    host, port = split_server_name(server_name)
    return f"https://{host}:{port or 8448}"


def split_server_name(server_name):
    """Splits `host[:port]`, `[v6]` or `[v6]:port` into (host, port or None)."""
    if server_name.startswith("["):
        host, _, rest = server_name.partition("]")
        return host + "]", int(rest[1:]) if rest.startswith(":") else None
    host, sep, port = server_name.rpartition(":")
    return (host, int(port)) if sep else (server_name, None)


def require_loopback(what, host):
    """Exits with status 2 unless every address `host` resolves to is a loopback one."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host.strip("[]"), None)}
    except socket.gaierror as e:
        usage_error(f"cannot resolve {what} host {host!r}: {e}")
    for address in addresses:
        if not ipaddress.ip_address(address.split("%")[0]).is_loopback:
            usage_error(f"{what} host {host!r} is not a loopback address: refusing")


def usage_error(message):
    print(f"interop.py: {message}", file=sys.stderr)
    sys.exit(2)


class Side:
    """One homeserver under test and the user the driver registers on it."""

    def __init__(self, label, client_url, server_name):
        self.label = label
        self.client_url = client_url.rstrip("/")
        self.server_name = server_name
        self.user_id = None
        self.access_token = None
        self.device_id = None
        self.signing_key = None  # the device's ed25519 key (signedjson SigningKey)
        self.device_keys = None  # the signed device keys as uploaded
        self.one_time_keys = {}  # key ID -> signed OTK object, as uploaded
        self.fallback_key = None  # (key ID, signed object)
        self.next_batch = None  # /sync position
        self.to_device = []  # every to-device event seen in /sync so far
        self.timeline = []  # every (room ID, event) of a joined room's timeline seen so far
        self.ephemeral = []  # every (room ID, event) of a joined room's ephemeral seen so far
        self.invites = {}  # room ID -> invite_state events, for every invite seen so far
        self.knocks = {}  # room ID -> knock_state events, for every knock seen so far
        self.left = []  # every (room ID, event) of a left room's timeline seen so far
        self.unread = {}  # room ID -> the latest unread_notifications /sync gave for it
        self.software = None  # the federation version endpoint's server name (check_version)

    def another_user(self, label):
        """A Side for a new user registered on the same server (label names it in messages)."""
        other = Side(label, self.client_url, self.server_name)
        other.software = self.software
        other.register()
        other.sync(0)
        return other

    def api(self, method, path, body=None, params=None, timeout=HTTP_TIMEOUT):
        """Calls this side's client API as its user; returns the body of a 200 answer."""
        return expect_200(
            method,
            self.client_url + "/_matrix/client/v3" + path,
            token=self.access_token,
            body=body,
            params=params,
            timeout=timeout,
        )

    def register(self):
        """Registers a fresh user with the m.login.dummy flow; the random suffix keeps reruns
        against the same server from colliding."""
        url = self.client_url + "/_matrix/client/v3/register"
        body = {
            "username": f"interop_{self.label.lower()}_{secrets.token_hex(4)}",
            "password": secrets.token_urlsafe(18),
            "auth": {"type": "m.login.dummy"},
            "initial_device_display_name": "interop.py",
        }
        status, data = request("POST", url, body=body)
        if status == 401 and isinstance(data, dict) and "session" in data:
            # The server wants the user-interactive auth round trip: answer within its session.
            body["auth"]["session"] = data["session"]
            status, data = request("POST", url, body=body)
        if status != 200:
            raise HttpError("POST", url, status, data)
        self.user_id = data["user_id"]
        self.access_token = data["access_token"]
        self.device_id = data["device_id"]
        if not self.user_id.endswith(":" + self.server_name):
            raise CheckFailed(f"registered {self.user_id}, not on {self.server_name}")
        self.signing_key = generate_signing_key(self.device_id)
        return self.user_id

    def signed(self, obj):
        """obj signed by this device's ed25519 key, as clients sign their keys."""
        return sign_json(obj, self.user_id, self.signing_key)

    def sync(self, timeout_ms):
        """One incremental /sync; accumulates what the checks look for."""
        params = {"timeout": str(timeout_ms)}
        if self.next_batch:
            params["since"] = self.next_batch
        data = self.api("GET", "/sync", params=params, timeout=timeout_ms / 1000 + HTTP_TIMEOUT)
        self.next_batch = data["next_batch"]
        self.to_device.extend(data.get("to_device", {}).get("events", []))
        for room_id, room in data.get("rooms", {}).get("invite", {}).items():
            self.invites[room_id] = room.get("invite_state", {}).get("events", [])
        for room_id, room in data.get("rooms", {}).get("knock", {}).items():
            self.knocks[room_id] = room.get("knock_state", {}).get("events", [])
        for room_id, room in data.get("rooms", {}).get("join", {}).items():
            for event in room.get("timeline", {}).get("events", []):
                self.timeline.append((room_id, event))
            for event in room.get("ephemeral", {}).get("events", []):
                self.ephemeral.append((room_id, event))
            if "unread_notifications" in room:
                self.unread[room_id] = room["unread_notifications"]
        for room_id, room in data.get("rooms", {}).get("leave", {}).items():
            for event in room.get("timeline", {}).get("events", []):
                self.left.append((room_id, event))

    def wait_for_timeline(self, room_id, matches):
        """Polls /sync until an event of room_id's timeline seen so far satisfies matches."""
        deadline = time.monotonic() + SYNC_WAIT
        while True:
            found = [e for (r, e) in self.timeline if r == room_id and matches(e)]
            if found:
                return found[0]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CheckFailed(f"not in {self.label}'s /sync of {room_id} within {SYNC_WAIT}s")
            self.sync(int(min(SYNC_POLL_MS, remaining * 1000)))

    def wait_for_ephemeral(self, room_id, matches, after=0):
        """Polls /sync until an ephemeral event of room_id seen so far (from index `after` of
        self.ephemeral on) satisfies matches."""
        deadline = time.monotonic() + SYNC_WAIT
        while True:
            found = [e for (r, e) in self.ephemeral[after:] if r == room_id and matches(e)]
            if found:
                return found[0]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CheckFailed(
                    f"not in {self.label}'s /sync ephemeral of {room_id} within {SYNC_WAIT}s"
                )
            self.sync(int(min(SYNC_POLL_MS, remaining * 1000)))

    def wait_for_to_device(self, matches):
        """Polls /sync until a to-device event seen so far satisfies matches(event)."""
        deadline = time.monotonic() + SYNC_WAIT
        while True:
            found = [event for event in self.to_device if matches(event)]
            if found:
                return found[0]
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CheckFailed(f"not in {self.label}'s /sync within {SYNC_WAIT}s")
            self.sync(int(min(SYNC_POLL_MS, remaining * 1000)))


def curve25519_key():
    """A fresh Curve25519 public key, unpadded base64, as an Olm account would publish."""
    return encode_base64(bytes(nacl.public.PrivateKey.generate().public_key))


def verify_device_signature(obj, owner):
    """Raises CheckFailed unless obj carries a valid signature by owner's device key."""
    try:
        verify_signed_json(obj, owner.user_id, get_verify_key(owner.signing_key))
    except SignatureVerifyException as e:
        raise CheckFailed(
            f"signature by {owner.user_id}/{owner.device_id} does not verify: {e}"
        ) from None


# ---- the checks: each returns a short detail for its `ok` line or raises -----------------


def check_register(side):
    return side.register()


def check_version(side):
    """The federation API's version endpoint answers over TLS with a certificate the CA signed."""
    ca = os.environ.get("FED_CA")
    if not ca:
        raise CheckFailed("FED_CA (the test CA's PEM file) is not set")
    url = federation_url(side.server_name) + "/_matrix/federation/v1/version"
    server = expect_200("GET", url, verify=ca).get("server")
    if not isinstance(server, dict) or not server.get("name"):
        raise CheckFailed(f"no server name object in the answer: {server!r}")
    side.software = server["name"]
    return f"{server['name']} {server.get('version', '')}".strip()


def check_server_keys(side):
    """The server's published signing keys are its own and sign the document itself."""
    ca = os.environ.get("FED_CA")
    if not ca:
        raise CheckFailed("FED_CA (the test CA's PEM file) is not set")
    url = federation_url(side.server_name) + "/_matrix/key/v2/server"
    doc = expect_200("GET", url, verify=ca)
    if doc.get("server_name") != side.server_name:
        raise CheckFailed(f"server_name is {doc.get('server_name')!r}, not {side.server_name!r}")
    if doc.get("valid_until_ts", 0) <= time.time() * 1000:
        raise CheckFailed(f"valid_until_ts {doc.get('valid_until_ts')} is not in the future")
    verify_keys = doc.get("verify_keys") or {}
    if not verify_keys:
        raise CheckFailed("no verify_keys")
    for key_id, key in verify_keys.items():
        verify_key = decode_verify_key_bytes(key_id, decode_base64(key["key"]))
        try:
            verify_signed_json(doc, side.server_name, verify_key)
        except SignatureVerifyException as e:
            raise CheckFailed(f"self-signature with {key_id} does not verify: {e}") from None
    return ", ".join(sorted(verify_keys))


def check_keys_upload(side):
    """Uploads properly self-signed device keys, two signed one-time keys and a fallback key."""
    device = side.device_id
    side.device_keys = side.signed(
        {
            "user_id": side.user_id,
            "device_id": device,
            "algorithms": ["m.olm.v1.curve25519-aes-sha2", "m.megolm.v1.aes-sha2"],
            "keys": {
                f"curve25519:{device}": curve25519_key(),
                f"ed25519:{device}": encode_verify_key_base64(get_verify_key(side.signing_key)),
            },
        }
    )
    side.one_time_keys = {
        f"{OTK_ALGORITHM}:AAAAA{i}": side.signed({"key": curve25519_key()}) for i in range(2)
    }
    side.fallback_key = (
        f"{OTK_ALGORITHM}:AAAAFB",
        side.signed({"key": curve25519_key(), "fallback": True}),
    )
    data = side.api(
        "POST",
        "/keys/upload",
        {
            "device_keys": side.device_keys,
            "one_time_keys": side.one_time_keys,
            "fallback_keys": dict([side.fallback_key]),
        },
    )
    count = data.get("one_time_key_counts", {}).get(OTK_ALGORITHM)
    if count != len(side.one_time_keys):
        raise CheckFailed(f"one_time_key_counts says {count} {OTK_ALGORITHM}, expected 2")
    return f"device {device}"


def check_profile(src, dst):
    """A display name set on src is what dst's profile lookup (query/profile) returns."""
    name = f"Interop {src.label} {secrets.token_hex(3)}"
    src.api("PUT", f"/profile/{quote(src.user_id)}/displayname", {"displayname": name})

    def probe():
        seen = dst.api("GET", f"/profile/{quote(src.user_id)}").get("displayname")
        if seen != name:
            raise CheckFailed(f"displayname is {seen!r}, expected {name!r}")

    eventually(probe)
    return name


def check_alias(src, dst):
    """An alias src makes for a room of its own resolves on dst (query/directory)."""
    room_id = src.api("POST", "/createRoom", {})["room_id"]
    alias = f"#interop_{secrets.token_hex(4)}:{src.server_name}"
    src.api("PUT", f"/directory/room/{quote(alias)}", {"room_id": room_id})

    def probe():
        data = dst.api("GET", f"/directory/room/{quote(alias)}")
        if data.get("room_id") != room_id:
            raise CheckFailed(f"{alias} resolves to {data.get('room_id')!r}, expected {room_id}")
        if src.server_name not in data.get("servers", []):
            raise CheckFailed(f"servers {data.get('servers')!r} lack {src.server_name}")

    eventually(probe)
    return alias


def check_public_rooms(src, dst):
    """A room src publishes is in the list dst fetches from src (publicRooms?server=)."""
    name = f"interop public {secrets.token_hex(4)}"
    room_id = src.api(
        "POST", "/createRoom", {"visibility": "public", "preset": "public_chat", "name": name}
    )["room_id"]

    def probe():
        params = {"server": src.server_name}
        for _ in range(50):  # pages; a long-lived server may list many rooms
            data = dst.api("GET", "/publicRooms", params=params)
            for room in data.get("chunk", []):
                if room.get("room_id") == room_id:
                    if room.get("name") != name:
                        raise CheckFailed(f"listed with name {room.get('name')!r}, not {name!r}")
                    return
            if not data.get("next_batch"):
                break
            params["since"] = data["next_batch"]
        raise CheckFailed(
            f"{room_id} not in {src.server_name}'s public rooms as seen by {dst.label}"
        )

    eventually(probe, timeout=PUBLIC_ROOMS_WAIT, interval=1)
    return room_id


def check_keys_query(src, dst):
    """dst's /keys/query for src's user returns src's device with the keys it uploaded."""

    def probe():
        data = dst.api("POST", "/keys/query", {"device_keys": {src.user_id: []}})
        device = data.get("device_keys", {}).get(src.user_id, {}).get(src.device_id)
        if device is None:
            failures = data.get("failures") or {}
            raise CheckFailed(f"device {src.device_id} not returned (failures: {failures})")
        return device

    device = eventually(probe)
    for field in ("user_id", "device_id", "algorithms", "keys"):
        if device.get(field) != src.device_keys[field]:
            raise CheckFailed(
                f"{field} is {device.get(field)!r}, uploaded {src.device_keys[field]!r}"
            )
    verify_device_signature(device, src)
    return f"{src.user_id}/{src.device_id}"


def check_keys_claim(src, dst):
    """dst claims src's one-time keys: two different uploaded OTKs, then the fallback or none."""

    def claim():
        data = dst.api(
            "POST", "/keys/claim", {"one_time_keys": {src.user_id: {src.device_id: OTK_ALGORITHM}}}
        )
        keys = data.get("one_time_keys", {}).get(src.user_id, {}).get(src.device_id, {})
        if len(keys) > 1:
            raise CheckFailed(f"one claim returned {len(keys)} keys")
        for key_id, key in keys.items():
            if not key_id.startswith(OTK_ALGORITHM + ":"):
                raise CheckFailed(f"claimed key {key_id} is not {OTK_ALGORITHM}")
            verify_device_signature(key, src)
            return key_id, key
        raise CheckFailed(f"no key returned (failures: {data.get('failures') or {}})")

    first_id, first = claim()
    if first_id not in src.one_time_keys or first["key"] != src.one_time_keys[first_id]["key"]:
        raise CheckFailed(f"first claim returned {first_id}: {first!r}, not an uploaded OTK")
    second_id, second = claim()
    if second_id == first_id or second["key"] == first["key"]:
        raise CheckFailed(f"second claim returned the first key again ({first_id})")
    if second_id not in src.one_time_keys:
        raise CheckFailed(f"second claim returned {second_id}, not the other uploaded OTK")
    # Both one-time keys are gone: what is left is the fallback key, or nothing.
    try:
        third_id, third = claim()
    except CheckFailed as e:
        if "no key returned" not in str(e):
            raise
        return f"{first_id}, {second_id}, then none"
    fallback_id, fallback = src.fallback_key
    if (third_id, third.get("key")) != (fallback_id, fallback["key"]):
        raise CheckFailed(f"third claim returned {third_id}: {third!r}, not the fallback key")
    return f"{first_id}, {second_id}, then the fallback {third_id}"


def check_to_device(src, dst):
    """A to-device message src's user sends to dst's device shows up in dst's /sync."""
    nonce = secrets.token_hex(8)
    messages = {dst.user_id: {dst.device_id: {"nonce": nonce}}}
    txn_id = f"interop-{secrets.token_hex(6)}"
    src.api("PUT", f"/sendToDevice/{TO_DEVICE_TYPE}/{txn_id}", {"messages": messages})
    event = dst.wait_for_to_device(lambda e: e.get("content", {}).get("nonce") == nonce)
    if event.get("sender") != src.user_id:
        raise CheckFailed(f"sender is {event.get('sender')!r}, expected {src.user_id}")
    if event.get("type") != TO_DEVICE_TYPE:
        raise CheckFailed(f"type is {event.get('type')!r}, expected {TO_DEVICE_TYPE}")
    return f"nonce {nonce}"


def check_room_join(src, dst, version, rooms):
    """src's user creates a room of `version` with a name; dst's user joins it through src's
    server. Both servers then list both users as joined, and dst's server has the room's name.
    The room is remembered in rooms[(src, dst, version)] for the checks that follow."""
    name = f"interop {version} {secrets.token_hex(3)}"
    room_id = src.api(
        "POST",
        "/createRoom",
        {"preset": "public_chat", "room_version": version, "name": name},
    )["room_id"]
    joined = dst.api("POST", f"/join/{quote(room_id)}", {}, params={"via": src.server_name})
    if joined.get("room_id") != room_id:
        raise CheckFailed(f"joined {joined!r}, not {room_id}")

    def both_joined(side):
        members = side.api("GET", f"/rooms/{quote(room_id)}/joined_members")["joined"]
        missing = [u for u in (src.user_id, dst.user_id) if u not in members]
        if missing:
            raise CheckFailed(f"{side.label} does not list {missing} as joined: {members!r}")

    eventually(lambda: both_joined(src))
    both_joined(dst)
    got = dst.api("GET", f"/rooms/{quote(room_id)}/state/m.room.name/")
    if got.get("name") != name:
        raise CheckFailed(f"{dst.label} has the name {got!r}, not {name!r}")
    rooms[(src.label, dst.label, version)] = room_id
    return room_id


def check_room_invite(src, dst, version):
    """src's user creates a private room of `version` and invites dst's user, whose /sync
    shows the invite with the room's name; accepting it (no `via`: the inviter's server is
    known from the invite) joins, and a message dst's user sends then reaches src."""
    name = f"invite {version} {secrets.token_hex(3)}"
    room_id = src.api(
        "POST",
        "/createRoom",
        {"preset": "private_chat", "room_version": version, "name": name},
    )["room_id"]
    src.api("POST", f"/rooms/{quote(room_id)}/invite", {"user_id": dst.user_id})
    deadline = time.monotonic() + SYNC_WAIT
    while room_id not in dst.invites:
        if time.monotonic() >= deadline:
            raise CheckFailed(f"no invite in {dst.label}'s /sync within {SYNC_WAIT}s")
        dst.sync(SYNC_POLL_MS)
    shown = {(e.get("type"), e.get("content", {}).get("name")) for e in dst.invites[room_id]}
    if ("m.room.name", name) not in shown:
        raise CheckFailed(f"the invite does not show the name: {dst.invites[room_id]!r}")
    dst.api("POST", f"/join/{quote(room_id)}", {})

    def joined():
        members = src.api("GET", f"/rooms/{quote(room_id)}/joined_members")["joined"]
        if dst.user_id not in members:
            raise CheckFailed(f"{src.label} does not list {dst.user_id} as joined")

    eventually(joined)
    check_room_message(dst, src, room_id)
    return room_id


def check_room_invite_reject(src, dst):
    """src's user invites dst's user into a private room; dst's user rejects the invite, and
    src's server learns that they left."""
    room_id = src.api("POST", "/createRoom", {"preset": "private_chat"})["room_id"]
    src.api("POST", f"/rooms/{quote(room_id)}/invite", {"user_id": dst.user_id})
    deadline = time.monotonic() + SYNC_WAIT
    while room_id not in dst.invites:
        if time.monotonic() >= deadline:
            raise CheckFailed(f"no invite in {dst.label}'s /sync within {SYNC_WAIT}s")
        dst.sync(SYNC_POLL_MS)
    dst.api("POST", f"/rooms/{quote(room_id)}/leave", {})

    def left():
        member = src.api("GET", f"/rooms/{quote(room_id)}/state/m.room.member/{quote(dst.user_id)}")
        if member.get("membership") != "leave":
            raise CheckFailed(f"{src.label} has {dst.user_id} as {member!r}")

    eventually(left)
    return room_id


def check_room_backfill(src, dst, version):
    """src's user creates a room of `version` (history visible to members, `shared`) and sends
    BACKFILL_MESSAGES messages; dst's user then joins and pages back through /messages: dst's
    server asks src's for the history before the join (/backfill), and every message shows,
    in order, down to the room's create event."""
    room_id = src.api(
        "POST", "/createRoom", {"preset": "public_chat", "room_version": version}
    )["room_id"]
    sent = []
    for n in range(BACKFILL_MESSAGES):
        body = f"before the join {n} {secrets.token_hex(3)}"
        src.api(
            "PUT",
            f"/rooms/{quote(room_id)}/send/m.room.message/bf-{secrets.token_hex(6)}",
            {"msgtype": "m.text", "body": body},
        )
        sent.append(body)
    dst.api("POST", f"/join/{quote(room_id)}", {}, params={"via": src.server_name})

    def paged_back():
        events, start = [], None
        for _ in range(BACKFILL_MESSAGES):
            params = {"dir": "b", "limit": "20"}
            if start:
                params["from"] = start
            page = dst.api("GET", f"/rooms/{quote(room_id)}/messages", params=params)
            events.extend(page.get("chunk", []))
            start = page.get("end")
            if not start or not page.get("chunk"):
                break
        events.reverse()
        bodies = [e["content"].get("body") for e in events if e.get("type") == "m.room.message"]
        if bodies != sent:
            raise CheckFailed(
                f"{dst.label} pages back {len(bodies)} of {len(sent)} messages: {bodies[:5]!r}..."
            )
        if not events or events[0].get("type") != "m.room.create":
            raise CheckFailed(f"{dst.label}'s history does not start at the create event")
        return len(events)

    return f"{eventually(paged_back)} events"


def knock_room(src, version, name):
    """A room of src's user, of `version`, named `name`, that takes knocks."""
    return src.api(
        "POST",
        "/createRoom",
        {
            "preset": "private_chat",
            "room_version": version,
            "name": name,
            "initial_state": [
                {"type": "m.room.join_rules", "state_key": "", "content": {"join_rule": "knock"}}
            ],
        },
    )["room_id"]


def wait_for_membership(side, room_id, user_id, membership):
    """Waits until side's server has user_id's membership in room_id as `membership`."""

    def has():
        member = side.api("GET", f"/rooms/{quote(room_id)}/state/m.room.member/{quote(user_id)}")
        if member.get("membership") != membership:
            raise CheckFailed(f"{side.label} has {user_id} as {member!r}, not {membership}")

    eventually(has)


def wait_for_knock(side, room_id):
    """Polls side's /sync until it shows its knock on room_id (rooms.knock)."""
    deadline = time.monotonic() + SYNC_WAIT
    while room_id not in side.knocks:
        if time.monotonic() >= deadline:
            raise CheckFailed(f"no knock in {side.label}'s /sync within {SYNC_WAIT}s")
        side.sync(SYNC_POLL_MS)
    return side.knocks[room_id]


def check_room_knock(src, dst, version):
    """dst's user knocks (make_knock/send_knock through src's server) on a room of src's user
    that takes knocks: src's server has the knock, dst's /sync shows the room under
    rooms.knock with its name; src's user invites them and they join."""
    name = f"knock {version} {secrets.token_hex(3)}"
    room_id = knock_room(src, version, name)
    knocked = dst.api(
        "POST", f"/knock/{quote(room_id)}", {"reason": "interop"}, params={"via": src.server_name}
    )
    if knocked.get("room_id") != room_id:
        raise CheckFailed(f"knocked on {knocked!r}, not {room_id}")
    wait_for_membership(src, room_id, dst.user_id, "knock")
    knock_state = wait_for_knock(dst, room_id)
    shown = {(e.get("type"), e.get("content", {}).get("name")) for e in knock_state}
    if ("m.room.name", name) not in shown:
        raise CheckFailed(f"the knock does not show the name: {dst.knocks[room_id]!r}")
    src.api("POST", f"/rooms/{quote(room_id)}/invite", {"user_id": dst.user_id})
    deadline = time.monotonic() + SYNC_WAIT
    while room_id not in dst.invites:
        if time.monotonic() >= deadline:
            raise CheckFailed(f"no invite in {dst.label}'s /sync within {SYNC_WAIT}s")
        dst.sync(SYNC_POLL_MS)
    dst.api("POST", f"/join/{quote(room_id)}", {})
    wait_for_membership(src, room_id, dst.user_id, "join")
    return room_id


def check_room_knock_withdraw(src, dst):
    """dst's user knocks on a room of src's user and withdraws the knock with /leave (through
    src's server: make_leave/send_leave), and src's server learns it; a knock on a public room
    is refused with 403 M_FORBIDDEN."""
    room_id = knock_room(src, "12", f"withdraw {secrets.token_hex(3)}")
    dst.api("POST", f"/knock/{quote(room_id)}", {}, params={"via": src.server_name})
    wait_for_membership(src, room_id, dst.user_id, "knock")
    wait_for_knock(dst, room_id)
    dst.api("POST", f"/rooms/{quote(room_id)}/leave", {})
    if dst.software == "Synapse":
        # Synapse withdraws its knocks on remote rooms locally only (RoomMemberMasterHandler.
        # remote_rescind_knock: it does not know which server to send the leave to).
        detail = "Synapse withdrew locally only"
        wait_for_membership(src, room_id, dst.user_id, "knock")
    else:
        detail = "withdrawn"
        wait_for_membership(src, room_id, dst.user_id, "leave")

    public = src.api("POST", "/createRoom", {"preset": "public_chat"})["room_id"]
    status, body = request(
        "POST",
        dst.client_url + f"/_matrix/client/v3/knock/{quote(public)}",
        token=dst.access_token,
        body={},
        params={"via": src.server_name},
    )
    if status != 403 or not isinstance(body, dict) or body.get("errcode") != "M_FORBIDDEN":
        raise CheckFailed(f"a knock on a public room got {status} {body!r}, not 403 M_FORBIDDEN")
    return f"{room_id} {detail}; a knock on a public room refused"


def check_room_message(src, dst, room_id):
    """A message src's user sends into a room both are in shows up in dst's /sync."""
    body = f"hello {secrets.token_hex(6)}"
    txn_id = f"interop-{secrets.token_hex(6)}"
    sent = src.api(
        "PUT",
        f"/rooms/{quote(room_id)}/send/m.room.message/{txn_id}",
        {"msgtype": "m.text", "body": body},
    )
    event = dst.wait_for_timeline(room_id, lambda e: e.get("content", {}).get("body") == body)
    if event.get("event_id") != sent["event_id"] or event.get("sender") != src.user_id:
        raise CheckFailed(f"{dst.label} got {event!r} for {sent['event_id']}")
    return sent["event_id"]


def check_room_typing(src, dst, room_id):
    """src's user starts typing in a room both are in: dst's /sync shows them typing; then
    stops: a later m.typing in dst's /sync no longer lists them."""
    path = f"/rooms/{quote(room_id)}/typing/{quote(src.user_id)}"

    def typing(event):
        return event.get("type") == "m.typing" and src.user_id in event.get("content", {}).get(
            "user_ids", []
        )

    before = len(dst.ephemeral)
    src.api("PUT", path, {"typing": True, "timeout": 30000})
    dst.wait_for_ephemeral(room_id, typing, before)
    started = time.monotonic()
    before = len(dst.ephemeral)
    src.api("PUT", path, {"typing": False})
    dst.wait_for_ephemeral(
        room_id, lambda e: e.get("type") == "m.typing" and not typing(e), before
    )
    return f"stop seen after {time.monotonic() - started:.2f}s"


def check_room_receipt(src, dst, room_id):
    """dst's user sends two messages; src's user marks the later one read privately and the
    earlier one read publicly. dst's /sync shows the public receipt (with its thread) and
    never the private one."""
    first = check_room_message(dst, src, room_id)
    second = check_room_message(dst, src, room_id)
    src.api("POST", f"/rooms/{quote(room_id)}/receipt/m.read.private/{quote(second)}", {})
    src.api(
        "POST", f"/rooms/{quote(room_id)}/receipt/m.read/{quote(first)}", {"thread_id": "main"}
    )

    def read_by_src(event_id):
        def matches(event):
            if event.get("type") != "m.receipt":
                return False
            return src.user_id in event.get("content", {}).get(event_id, {}).get("m.read", {})

        return matches

    event = dst.wait_for_ephemeral(room_id, read_by_src(first))
    thread = event["content"][first]["m.read"][src.user_id].get("thread_id")
    if thread != "main":
        raise CheckFailed(f"{dst.label} got the receipt with thread_id {thread!r}: {event!r}")
    leaked = [
        e
        for (r, e) in dst.ephemeral
        if r == room_id
        and e.get("type") == "m.receipt"
        and src.user_id in json.dumps(e.get("content", {}).get(second, {}))
    ]
    if leaked:
        raise CheckFailed(f"{dst.label} got a receipt of the private read: {leaked!r}")
    return f"receipt on {first}"


def send_message(side, room_id, content, event_type="m.room.message"):
    """side's user sends an event into room_id; returns its event ID."""
    txn_id = f"interop-{secrets.token_hex(6)}"
    path = f"/rooms/{quote(room_id)}/send/{event_type}/{txn_id}"
    return side.api("PUT", path, content)["event_id"]


def get_event(side, room_id, event_id):
    """The event as side's server serves it to its user (/rooms/{roomId}/event/{eventId})."""
    return side.api("GET", f"/rooms/{quote(room_id)}/event/{quote(event_id)}")


def relates_to(event):
    return event.get("content", {}).get("m.relates_to", {})


def check_room_edit(src, dst, room_id):
    """src's user edits their message (m.replace): dst's /sync shows the edit, and dst's server
    serves the original with the edit bundled (unsigned.m.relations.m.replace)."""
    original = check_room_message(src, dst, room_id)
    new_body = f"edited {secrets.token_hex(6)}"
    edit = send_message(
        src,
        room_id,
        {
            "msgtype": "m.text",
            "body": f"* {new_body}",
            "m.new_content": {"msgtype": "m.text", "body": new_body},
            "m.relates_to": {"rel_type": "m.replace", "event_id": original},
        },
    )
    seen = dst.wait_for_timeline(room_id, lambda e: e.get("event_id") == edit)
    if relates_to(seen) != {"rel_type": "m.replace", "event_id": original}:
        raise CheckFailed(f"{dst.label} got the edit as {seen!r}")
    if seen.get("content", {}).get("m.new_content", {}).get("body") != new_body:
        raise CheckFailed(f"{dst.label} got the edit without its new content: {seen!r}")

    def bundled():
        event = get_event(dst, room_id, original)
        replace = event.get("unsigned", {}).get("m.relations", {}).get("m.replace")
        if not isinstance(replace, dict) or replace.get("event_id") != edit:
            raise CheckFailed(f"{dst.label} serves the original with {event.get('unsigned')!r}")
        page = dst.api("GET", f"/rooms/{quote(room_id)}/messages", params={"dir": "b"})
        listed = [e for e in page.get("chunk", []) if e.get("event_id") == original]
        if not listed:
            raise CheckFailed(f"{dst.label}'s /messages lack {original}")
        replace = listed[0].get("unsigned", {}).get("m.relations", {}).get("m.replace")
        if not isinstance(replace, dict) or replace.get("event_id") != edit:
            raise CheckFailed(f"{dst.label}'s /messages give the original as {listed[0]!r}")

    eventually(bundled)
    return f"{edit} bundled into {original} (/event and /messages)"


def check_room_reaction(src, dst, room_id):
    """src's user reacts (m.annotation) to a message of dst's user: dst's /sync shows the
    reaction, and dst's /relations of the message lists it."""
    target = check_room_message(dst, src, room_id)
    key = f"👍 {secrets.token_hex(2)}"
    reaction = send_message(
        src,
        room_id,
        {"m.relates_to": {"rel_type": "m.annotation", "event_id": target, "key": key}},
        "m.reaction",
    )
    seen = dst.wait_for_timeline(room_id, lambda e: e.get("event_id") == reaction)
    expected = {"rel_type": "m.annotation", "event_id": target, "key": key}
    if seen.get("type") != "m.reaction" or relates_to(seen) != expected:
        raise CheckFailed(f"{dst.label} got the reaction as {seen!r}")
    url = (
        dst.client_url
        + f"/_matrix/client/v1/rooms/{quote(room_id)}/relations/{quote(target)}/m.annotation"
    )
    chunk = expect_200("GET", url, token=dst.access_token).get("chunk", [])
    if reaction not in [e.get("event_id") for e in chunk]:
        raise CheckFailed(f"{dst.label}'s /relations of {target} lack {reaction}: {chunk!r}")
    # Taking the reaction back is redacting it: it leaves the other side's relations.
    src.api(
        "PUT",
        f"/rooms/{quote(room_id)}/redact/{quote(reaction)}/interop-{secrets.token_hex(6)}",
        {},
    )

    def withdrawn():
        chunk = expect_200("GET", url, token=dst.access_token).get("chunk", [])
        if reaction in [e.get("event_id") for e in chunk]:
            raise CheckFailed(f"{dst.label}'s /relations of {target} still list {reaction}")

    eventually(withdrawn)
    return f"{reaction} on {target}, then withdrawn"


def check_room_redaction(src, dst, room_id):
    """src's user redacts their message: dst's /sync shows the redaction, and dst's server then
    serves the message redacted (no body, unsigned.redacted_because)."""
    target = check_room_message(src, dst, room_id)
    txn_id = f"interop-{secrets.token_hex(6)}"
    redaction = src.api(
        "PUT", f"/rooms/{quote(room_id)}/redact/{quote(target)}/{txn_id}", {"reason": "interop"}
    )["event_id"]
    seen = dst.wait_for_timeline(room_id, lambda e: e.get("event_id") == redaction)
    redacts = seen.get("redacts") or seen.get("content", {}).get("redacts")
    if seen.get("type") != "m.room.redaction" or redacts != target:
        raise CheckFailed(f"{dst.label} got the redaction as {seen!r}")

    def redacted():
        event = get_event(dst, room_id, target)
        if event.get("content"):
            raise CheckFailed(f"{dst.label} still serves {target} with {event.get('content')!r}")
        because = event.get("unsigned", {}).get("redacted_because", {})
        if because.get("event_id") != redaction:
            raise CheckFailed(f"{dst.label} serves {target} without redacted_because: {event!r}")

    eventually(redacted)
    return f"{target} redacted by {redaction}"


def check_room_redaction_moderator(creator, joiner, room_id):
    """creator's user (who has the power to) redacts a message of joiner's user: joiner's
    server accepts the redaction from the other server and serves its own user's message
    redacted."""
    target = check_room_message(joiner, creator, room_id)
    txn_id = f"interop-{secrets.token_hex(6)}"
    redaction = creator.api(
        "PUT", f"/rooms/{quote(room_id)}/redact/{quote(target)}/{txn_id}", {"reason": "mod"}
    )["event_id"]
    joiner.wait_for_timeline(room_id, lambda e: e.get("event_id") == redaction)

    def redacted():
        event = get_event(joiner, room_id, target)
        if event.get("content"):
            raise CheckFailed(f"{joiner.label} still serves {target} with {event['content']!r}")
        because = event.get("unsigned", {}).get("redacted_because", {})
        if because.get("event_id") != redaction:
            raise CheckFailed(f"{joiner.label} serves {target} without redacted_because")

    eventually(redacted)
    return f"{target} redacted by {redaction}"


def wait_for_unread(side, room_id, matches, what):
    """Polls side's /sync until the room's latest unread_notifications satisfy matches."""
    deadline = time.monotonic() + SYNC_WAIT
    while not matches(side.unread.get(room_id, {}).get("notification_count", 0)):
        if time.monotonic() >= deadline:
            raise CheckFailed(
                f"{side.label}'s unread_notifications of {room_id} are"
                f" {side.unread.get(room_id)!r}, not {what}, after {SYNC_WAIT}s"
            )
        side.sync(SYNC_POLL_MS)


def check_room_unread(src, dst, room_id):
    """A message src's user sends raises dst's notification_count in /sync's
    unread_notifications by one; dst's user's read receipt on it brings it back to 0."""
    latest = dst.api("GET", f"/rooms/{quote(room_id)}/messages", params={"dir": "b", "limit": "1"})
    if latest.get("chunk"):
        read = latest["chunk"][0]["event_id"]
        dst.api("POST", f"/rooms/{quote(room_id)}/receipt/m.read/{quote(read)}", {})
    dst.sync(0)
    wait_for_unread(dst, room_id, lambda n: n == 0, "0 once read")
    message = check_room_message(src, dst, room_id)
    wait_for_unread(dst, room_id, lambda n: n == 1, "1 after a message")
    dst.api("POST", f"/rooms/{quote(room_id)}/receipt/m.read/{quote(message)}", {})
    wait_for_unread(dst, room_id, lambda n: n == 0, "0 after the receipt")
    # A mention of dst's user (m.mentions) highlights: highlight_count 1, and 0 once read.
    mention = send_message(
        src,
        room_id,
        {"msgtype": "m.text", "body": "hey you", "m.mentions": {"user_ids": [dst.user_id]}},
    )
    dst.wait_for_timeline(room_id, lambda e: e.get("event_id") == mention)
    wait_for_unread(dst, room_id, lambda n: n == 1, "1 after a mention")
    highlights = dst.unread.get(room_id, {}).get("highlight_count", 0)
    if highlights != 1:
        raise CheckFailed(f"{dst.label}'s highlight_count is {highlights} after a mention, not 1")
    dst.api("POST", f"/rooms/{quote(room_id)}/receipt/m.read/{quote(mention)}", {})
    wait_for_unread(dst, room_id, lambda n: n == 0, "0 after reading the mention")
    if dst.unread[room_id].get("highlight_count", 0) != 0:
        raise CheckFailed(f"{dst.label}'s highlight_count stays {dst.unread[room_id]!r}")
    return f"1 then 0 for {message}; a mention highlighted"


def shared_room(creator, joiner, version):
    """A fresh public room of creator's user, of `version`, that joiner's user has joined
    (both servers list both as joined)."""
    room_id = creator.api(
        "POST", "/createRoom", {"preset": "public_chat", "room_version": version}
    )["room_id"]
    joiner.api("POST", f"/join/{quote(room_id)}", {}, params={"via": creator.server_name})
    wait_for_membership(creator, room_id, joiner.user_id, "join")
    return room_id


def check_room_leave(creator, joiner, leaver, version):
    """In a room of creator's user that joiner's user joined, `leaver` leaves: the other
    side's server has them as left, and its user's /sync shows the leave."""
    room_id = shared_room(creator, joiner, version)
    other = joiner if leaver is creator else creator
    leaver.api("POST", f"/rooms/{quote(room_id)}/leave", {})
    wait_for_membership(other, room_id, leaver.user_id, "leave")
    leave = other.wait_for_timeline(
        room_id,
        lambda e: e.get("type") == "m.room.member"
        and e.get("state_key") == leaver.user_id
        and e.get("content", {}).get("membership") == "leave",
    )
    deadline = time.monotonic() + SYNC_WAIT
    left = leave["event_id"]
    while not any(r == room_id and e.get("event_id") == left for (r, e) in leaver.left):
        if time.monotonic() >= deadline:
            raise CheckFailed(f"the leave is not in {leaver.label}'s rooms.leave")
        leaver.sync(SYNC_POLL_MS)
    # What the room says after the leave is not the leaver's to see: not in their /sync, not
    # in their /messages (a second message gives the first time to travel, were it sent to
    # the leaver's server at all).
    after = check_room_message(other, other, room_id)
    check_room_message(other, other, room_id)
    leaver.sync(0)
    page = leaver.api("GET", f"/rooms/{quote(room_id)}/messages", params={"dir": "b"})
    seen = [e for (r, e) in leaver.left + leaver.timeline if r == room_id]
    if after in [e.get("event_id") for e in seen + page.get("chunk", [])]:
        raise CheckFailed(f"{leaver.label}'s user sees {after}, sent after they left")
    return f"{leave['event_id']} in {room_id}"


def check_room_ban(creator, joiner, banner, version):
    """In a room of creator's user that joiner's user joined, `banner` (creator's user, or
    joiner's user made a moderator by creator's) bans a second user of the other server, who
    had joined too. The other server, still in the room through its first user, has the ban in
    its state; the banned user's /sync shows it (the room among those left); a message the
    banned user then tries to send is refused by their server, or never reaches the room on
    banner's server."""
    room_id = shared_room(creator, joiner, version)
    other = joiner if banner is creator else creator
    if banner is joiner:
        levels = creator.api("GET", f"/rooms/{quote(room_id)}/state/m.room.power_levels/")
        levels.setdefault("users", {})[joiner.user_id] = 100
        creator.api("PUT", f"/rooms/{quote(room_id)}/state/m.room.power_levels/", levels)
        wait_for_state(
            joiner, room_id, "m.room.power_levels", lambda c: joiner.user_id in c.get("users", {})
        )
    victim = other.another_user(f"{other.label}2")
    victim.api("POST", f"/join/{quote(room_id)}", {}, params={"via": creator.server_name})
    wait_for_membership(banner, room_id, victim.user_id, "join")
    banner.api(
        "POST", f"/rooms/{quote(room_id)}/ban", {"user_id": victim.user_id, "reason": "interop"}
    )
    wait_for_membership(other, room_id, victim.user_id, "ban")
    deadline = time.monotonic() + SYNC_WAIT
    while not any(
        r == room_id
        and e.get("type") == "m.room.member"
        and e.get("state_key") == victim.user_id
        and e.get("content", {}).get("membership") == "ban"
        for (r, e) in victim.left
    ):
        if time.monotonic() >= deadline:
            raise CheckFailed(f"no ban in {victim.label}'s /sync within {SYNC_WAIT}s")
        victim.sync(SYNC_POLL_MS)

    body = f"banned {secrets.token_hex(6)}"
    status, answer = request(
        "PUT",
        victim.client_url
        + f"/_matrix/client/v3/rooms/{quote(room_id)}/send/m.room.message/b-{secrets.token_hex(6)}",
        token=victim.access_token,
        body={"msgtype": "m.text", "body": body},
    )
    if status == 403:
        refused = answer.get("errcode")
        return f"{victim.user_id} banned in {room_id}; their send refused with {refused}"
    if status != 200:
        raise CheckFailed(f"the banned user's send got {status} {answer!r}")
    # Accepted locally: it must never show on banner's server. A message sent after it from
    # the same server arrives in order, so once that one is there, the other would be too.
    marker = check_room_message(other, banner, room_id)
    shown = [
        e for (r, e) in banner.timeline if r == room_id and e.get("content", {}).get("body") == body
    ]
    status, _ = request(
        "GET",
        banner.client_url
        + f"/_matrix/client/v3/rooms/{quote(room_id)}/event/{quote(answer['event_id'])}",
        token=banner.access_token,
    )
    if shown or status == 200:
        raise CheckFailed(f"{banner.label} shows the banned user's message {answer['event_id']}")
    return f"banned in {room_id}; the send accepted locally, never shown (before {marker})"


def check_room_kick_unban(creator, joiner, version):
    """In a room of creator's user that joiner's user joined, creator's user kicks them:
    joiner's /sync shows the kick; creator's user bans them, then lifts the ban: joiner's
    server learns of both (the ban and unban reach it though it is out of the room, as the
    target's server), and joiner's user can join again through creator's server."""
    room_id = shared_room(creator, joiner, version)

    def left_as(membership, sender):
        def matches():
            return any(
                r == room_id
                and e.get("type") == "m.room.member"
                and e.get("state_key") == joiner.user_id
                and e.get("sender") == sender
                and e.get("content", {}).get("membership") == membership
                for (r, e) in joiner.left
            )

        deadline = time.monotonic() + SYNC_WAIT
        while not matches():
            if time.monotonic() >= deadline:
                raise CheckFailed(f"no {membership} in {joiner.label}'s rooms.leave")
            joiner.sync(SYNC_POLL_MS)

    creator.api("POST", f"/rooms/{quote(room_id)}/kick", {"user_id": joiner.user_id})
    left_as("leave", creator.user_id)
    creator.api("POST", f"/rooms/{quote(room_id)}/ban", {"user_id": joiner.user_id})
    status, body = request(
        "POST",
        joiner.client_url + f"/_matrix/client/v3/join/{quote(room_id)}",
        token=joiner.access_token,
        body={},
        params={"via": creator.server_name},
    )
    if status != 403:
        raise CheckFailed(f"a banned user's join got {status} {body!r}, not 403")
    creator.api("POST", f"/rooms/{quote(room_id)}/unban", {"user_id": joiner.user_id})
    joiner.api("POST", f"/join/{quote(room_id)}", {}, params={"via": creator.server_name})
    wait_for_membership(creator, room_id, joiner.user_id, "join")
    check_room_message(creator, joiner, room_id)
    return f"kicked, banned, unbanned and back in {room_id}"


def wait_for_state(side, room_id, event_type, matches):
    """Waits until side's server has a state event of event_type whose content matches."""

    def has():
        content = side.api("GET", f"/rooms/{quote(room_id)}/state/{event_type}/")
        if not matches(content):
            raise CheckFailed(f"{side.label} has {event_type} {content!r}")

    eventually(has)


def quote(s):
    """Percent-encodes a path segment (user IDs and aliases carry @, #, :)."""
    return urllib.parse.quote(s, safe="")


class Report:
    """Runs checks, prints one line each and counts the outcomes."""

    def __init__(self):
        self.passed = 0
        self.failed = 0

    def run(self, name, check, *args):
        global _retries
        _retries = 0
        started = time.monotonic()
        try:
            detail = check(*args)
        except Exception as e:  # a malformed answer (KeyError, ...) fails the check, not the run
            why = str(e) if isinstance(e, CheckFailed) else f"{type(e).__name__}: {e}"
            print(f"FAIL {name}: {why}", flush=True)
            self.failed += 1
            return False
        took = time.monotonic() - started
        retried = f", {_retries} retries" if _retries else ""
        print(f"ok {name} ({detail}; {took:.2f}s{retried})", flush=True)
        self.passed += 1
        return True


def main(argv):
    if len(argv) != 5:
        usage_error("usage: " + __doc__.strip().splitlines()[2].strip())
    a = Side("A", argv[1], argv[2])
    b = Side("B", argv[3], argv[4])
    for side in (a, b):
        require_loopback(
            f"{side.label}'s client URL", urllib.parse.urlsplit(side.client_url).hostname or ""
        )
        require_loopback(f"{side.label}'s server name", split_server_name(side.server_name)[0])

    report = Report()
    started = time.monotonic()
    if not all([report.run(f"register {s.label}", check_register, s) for s in (a, b)]):
        print(f"{report.passed} passed, {report.failed} failed")
        return 1
    # An initial /sync now, so that every later wait polls incrementally.
    for side in (a, b):
        side.sync(0)

    for name, check in [
        ("version", check_version),
        ("server_keys", check_server_keys),
        ("keys_upload", check_keys_upload),
    ]:
        for side in (a, b):
            report.run(f"{name} {side.label}", check, side)
    for name, check in [
        ("profile", check_profile),
        ("alias", check_alias),
        ("public_rooms", check_public_rooms),
        ("keys_query", check_keys_query),
        ("keys_claim", check_keys_claim),
        ("to_device", check_to_device),
    ]:
        for src, dst in ((a, b), (b, a)):
            report.run(f"{name} {src.label}->{dst.label}", check, src, dst)

    rooms = {}
    for version in ("11", "12"):
        for src, dst in ((a, b), (b, a)):
            report.run(
                f"room_join v{version} {src.label}->{dst.label}",
                check_room_join,
                src,
                dst,
                version,
                rooms,
            )

    for (creator, joiner, version), room_id in sorted(rooms.items()):
        sides = {a.label: a, b.label: b}
        for src, dst in ((creator, joiner), (joiner, creator)):
            report.run(
                f"room_message v{version} {src}->{dst} (room of {creator})",
                check_room_message,
                sides[src],
                sides[dst],
                room_id,
            )
            report.run(
                f"room_typing v{version} {src}->{dst} (room of {creator})",
                check_room_typing,
                sides[src],
                sides[dst],
                room_id,
            )
            report.run(
                f"room_receipt v{version} {src}->{dst} (room of {creator})",
                check_room_receipt,
                sides[src],
                sides[dst],
                room_id,
            )
            for name, check in [
                ("room_edit", check_room_edit),
                ("room_reaction", check_room_reaction),
                ("room_redaction", check_room_redaction),
                ("room_unread", check_room_unread),
            ]:
                report.run(
                    f"{name} v{version} {src}->{dst} (room of {creator})",
                    check,
                    sides[src],
                    sides[dst],
                    room_id,
                )
        report.run(
            f"room_redaction_moderator v{version} {creator}->{joiner} (room of {creator})",
            check_room_redaction_moderator,
            sides[creator],
            sides[joiner],
            room_id,
        )

    for version in ("11", "12"):
        for src, dst in ((a, b), (b, a)):
            report.run(
                f"room_invite v{version} {src.label}->{dst.label}",
                check_room_invite,
                src,
                dst,
                version,
            )

    for src, dst in ((a, b), (b, a)):
        report.run(
            f"room_invite_reject {src.label}->{dst.label}", check_room_invite_reject, src, dst
        )

    for version in ("11", "12"):
        for src, dst in ((a, b), (b, a)):
            report.run(
                f"room_backfill v{version} {src.label}->{dst.label}",
                check_room_backfill,
                src,
                dst,
                version,
            )

    for version in ("11", "12"):
        for src, dst in ((a, b), (b, a)):
            report.run(
                f"room_knock v{version} {src.label}->{dst.label}",
                check_room_knock,
                src,
                dst,
                version,
            )
    for src, dst in ((a, b), (b, a)):
        report.run(
            f"room_knock_withdraw {src.label}->{dst.label}", check_room_knock_withdraw, src, dst
        )

    for version in ("11", "12"):
        for creator, joiner in ((a, b), (b, a)):
            for leaver in (joiner, creator):
                report.run(
                    f"room_leave v{version} {leaver.label} leaves (room of {creator.label})",
                    check_room_leave,
                    creator,
                    joiner,
                    leaver,
                    version,
                )
            report.run(
                f"room_kick_unban v{version} {creator.label} kicks {joiner.label}",
                check_room_kick_unban,
                creator,
                joiner,
                version,
            )
            for banner in (creator, joiner):
                report.run(
                    f"room_ban v{version} {banner.label} bans a user of the other side"
                    f" (room of {creator.label})",
                    check_room_ban,
                    creator,
                    joiner,
                    banner,
                    version,
                )

    print(f"checks took {time.monotonic() - started:.1f}s")
    print(f"{report.passed} passed, {report.failed} failed")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
