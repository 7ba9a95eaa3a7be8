#!/usr/bin/env python3
"""Delivery latency across federation, measured through the client APIs: to-device messages
and room messages.

    latency.py A_CLIENT_URL A_SERVER_NAME B_CLIENT_URL B_SERVER_NAME [N]

Registers a user on each side, then N times each way: the receiver's /sync long-poll is
already waiting when the sender's PUT /sendToDevice (or PUT /rooms/.../send, in a room A's
user created and B's user joined through A) starts; the latency is from that start until
the long-poll returns with the message (send, federation transaction, receiver checks and
commit, wake-up, response). Prints p50, p95 and max in milliseconds per direction. A benchmark, not a
test: it never fails on a number. Loopback addresses only (see interop.py).
"""

import secrets
import statistics
import sys
import threading
import time
import urllib.parse

from interop import Side, require_loopback, split_server_name

TO_DEVICE_TYPE = "org.myelin.latency"


def one_way(src, dst, n):
    """N sequential messages src -> dst; the latencies in ms."""
    dst.sync(0)  # start from now
    latencies = []
    for i in range(n):
        nonce = secrets.token_hex(8)
        arrived = threading.Event()

        def wait():
            while not arrived.is_set():
                dst.sync(10_000)
                if any(e.get("content", {}).get("nonce") == nonce for e in dst.to_device):
                    arrived.set()

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.05)  # let the long-poll reach the server
        started = time.monotonic()
        src.api(
            "PUT",
            f"/sendToDevice/{TO_DEVICE_TYPE}/lat{i}{nonce}",
            body={"messages": {dst.user_id: {dst.device_id: {"nonce": nonce}}}},
        )
        waiter.join(timeout=30)
        if not arrived.is_set():
            raise SystemExit(f"message {i} {src.label}->{dst.label} did not arrive in 30 s")
        latencies.append((time.monotonic() - started) * 1000)
        dst.to_device.clear()
    return latencies


def one_way_room(src, dst, room_id, n):
    """N sequential room messages src -> dst in room_id; the latencies in ms."""
    dst.sync(0)  # start from now
    latencies = []
    for i in range(n):
        body = f"latency {secrets.token_hex(8)}"
        arrived = threading.Event()

        def wait():
            while not arrived.is_set():
                dst.sync(10_000)
                if any(
                    r == room_id and e.get("content", {}).get("body") == body
                    for (r, e) in dst.timeline
                ):
                    arrived.set()

        waiter = threading.Thread(target=wait)
        waiter.start()
        time.sleep(0.05)  # let the long-poll reach the server
        started = time.monotonic()
        src.api(
            "PUT",
            f"/rooms/{urllib.parse.quote(room_id, safe='')}/send/m.room.message/lat{i}{body[-16:]}",
            body={"msgtype": "m.text", "body": body},
        )
        waiter.join(timeout=30)
        if not arrived.is_set():
            raise SystemExit(f"room message {i} {src.label}->{dst.label} did not arrive in 30 s")
        latencies.append((time.monotonic() - started) * 1000)
        dst.timeline.clear()
    return latencies


def summary(latencies):
    ordered = sorted(latencies)
    p95 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))]
    return f"p50 {statistics.median(ordered):.0f} ms, p95 {p95:.0f} ms, max {ordered[-1]:.0f} ms"


def main(argv):
    if len(argv) not in (5, 6):
        print(__doc__, file=sys.stderr)
        return 2
    a = Side("A", argv[1], argv[2])
    b = Side("B", argv[3], argv[4])
    n = int(argv[5]) if len(argv) == 6 else 20
    for side in (a, b):
        require_loopback(side.label, split_server_name(side.server_name)[0])
        require_loopback(side.label, urllib.parse.urlparse(side.client_url).hostname)
        side.register()
    # The first message of each way also pays for key fetches and connection set-up.
    one_way(a, b, 1)
    one_way(b, a, 1)
    print(f"A->B ({a.server_name} -> {b.server_name}), {n} to-device messages: {summary(one_way(a, b, n))}")
    print(f"B->A ({b.server_name} -> {a.server_name}), {n} to-device messages: {summary(one_way(b, a, n))}")
    room_id = a.api("POST", "/createRoom", {"preset": "public_chat", "room_version": "11"})["room_id"]
    b.api(
        "POST",
        f"/join/{urllib.parse.quote(room_id, safe='')}",
        {},
        params={"via": a.server_name},
    )
    one_way_room(a, b, room_id, 1)
    one_way_room(b, a, room_id, 1)
    print(f"A->B ({a.server_name} -> {b.server_name}), {n} room messages: {summary(one_way_room(a, b, room_id, n))}")
    print(f"B->A ({b.server_name} -> {a.server_name}), {n} room messages: {summary(one_way_room(b, a, room_id, n))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
