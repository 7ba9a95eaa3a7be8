#!/usr/bin/env python3
"""The federation scenario of the benchmark (tests/bench/federation.sh starts the servers).

    federation.py SCALE OUT.json M1_URL M1_NAME M2_URL M2_NAME S1_URL S1_NAME S2_URL S2_NAME

M1 and M2 are Myelins, S1 and S2 Synapses, all federating over TLS on loopback. Measures,
through the client APIs only:

  latency  room-message delivery A->B for M1->M2, M1->S1, S1->M1, S1->S2: the receiver's
           /sync long-poll already waits when the sender's PUT starts (latency.py's method);
  burst    BURST messages sent back to back by one user on A into a room B's user is in;
           the time from the first send until B's /sync has the last one, and B's /messages
           checked to hold all of them, each once, in the order sent (M1->M2, M1->S1, S1->M1);
  join     a room on M1 with MEMBERS local members; the time of a user on B's /join of it
           (B = M2, then S1), while another user on B sends into a room local to B every
           50 ms: that send's latency before the join and during it.

Writes every number to OUT.json and prints a summary. Exit status 3 when a burst arrived
incomplete or out of order (the numbers are still written). A benchmark: it never fails
on a number.
"""

import json
import os
import secrets
import statistics
import sys
import threading
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor

import requests

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "federation"))
from interop import HttpError, Side, require_loopback, split_server_name  # noqa: E402
from latency import one_way_room  # noqa: E402

SCALES = {
    # latency messages per direction, burst size, big room's members
    "smoke": {"latency": 5, "burst": 50, "members": 20},
    "full": {"latency": 50, "burst": 1000, "members": 1000},
}
BURST_WAIT = 120  # seconds to wait for the last burst message on the receiving side
LOCAL_SEND_INTERVAL = 0.05  # seconds between the local sends measured during a join
BASELINE_SECONDS = 3  # local sends measured before the join starts


class Client(Side):
    """A Side whose requests go over one kept-alive connection pool, as a client's would."""

    def __init__(self, label, client_url, server_name):
        super().__init__(label, client_url, server_name)
        self.session = requests.Session()

    def api(self, method, path, body=None, params=None, timeout=30):
        headers = {"Authorization": f"Bearer {self.access_token}"} if self.access_token else {}
        url = self.client_url + "/_matrix/client/v3" + path
        resp = self.session.request(
            method, url, headers=headers, json=body, params=params, timeout=timeout
        )
        if resp.status_code != 200:
            raise HttpError(method, url, resp.status_code, resp.text)
        return resp.json()

    def register_fast(self, localpart):
        """Registers localpart, with no password where the server allows it (no hashing cost:
        this is set-up, not measured)."""
        body = {"username": localpart, "auth": {"type": "m.login.dummy"}}
        url = self.client_url + "/_matrix/client/v3/register"
        data = self.session.post(url, json=body, timeout=60).json()
        if data.get("errcode") == "M_MISSING_PARAM":  # Synapse wants a password
            body["password"] = secrets.token_urlsafe(18)
            data = self.session.post(url, json=body, timeout=60).json()
        if "access_token" not in data:
            raise SystemExit(f"registering {localpart} on {self.label}: {data}")
        self.user_id, self.access_token, self.device_id = (
            data["user_id"],
            data["access_token"],
            data["device_id"],
        )
        return self


def quote(room_id):
    return urllib.parse.quote(room_id, safe="")


def percentile(values, p):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * p / 100))]


def stats(values):
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "p50_ms": round(statistics.median(values), 2),
        "p90_ms": round(percentile(values, 90), 2),
        "max_ms": round(max(values), 2),
    }


def fresh(server, label):
    return Client(label, server[0], server[1]).register_fast(f"fb_{label.lower()}_{secrets.token_hex(4)}")


def shared_room(a, b):
    """A room a's user creates and b's user joins through a's server."""
    room_id = a.api("POST", "/createRoom", {"preset": "public_chat", "room_version": "11"})["room_id"]
    b.api("POST", f"/join/{quote(room_id)}", {}, params={"server_name": a.server_name, "via": a.server_name})
    return room_id


def latency(src_server, dst_server, label, n):
    a, b = fresh(src_server, "A"), fresh(dst_server, "B")
    room_id = shared_room(a, b)
    one_way_room(a, b, room_id, 2)  # warm-up: key fetches, connections
    result = stats(one_way_room(a, b, room_id, n))
    print(f"latency {label}: {result}", flush=True)
    return result


def received_bodies(client, room_id, prefix):
    """Every m.room.message body starting with prefix in room_id, oldest first, from /messages."""
    bodies, token = [], None
    while True:
        params = {"dir": "b", "limit": "500"}
        if token:
            params["from"] = token
        page = client.api("GET", f"/rooms/{quote(room_id)}/messages", params=params)
        for event in page.get("chunk", []):
            body = event.get("content", {}).get("body")
            if event.get("type") == "m.room.message" and isinstance(body, str) and body.startswith(prefix):
                bodies.append(body)
        token = page.get("end")
        if not page.get("chunk") or not token:
            break
    bodies.reverse()
    return bodies


def burst(src_server, dst_server, label, n):
    a, b = fresh(src_server, "A"), fresh(dst_server, "B")
    room_id = shared_room(a, b)
    one_way_room(a, b, room_id, 1)
    b.sync(0)
    b.timeline.clear()
    prefix = f"burst {secrets.token_hex(4)} "
    last = f"{prefix}{n - 1:05d}"
    seen_last = threading.Event()
    seen_at = [None]

    def watch():
        deadline = time.monotonic() + BURST_WAIT
        while time.monotonic() < deadline:
            b.sync(5000)
            if any(r == room_id and e.get("content", {}).get("body") == last for (r, e) in b.timeline):
                seen_at[0] = time.monotonic()
                seen_last.set()
                return
            b.timeline.clear()

    watcher = threading.Thread(target=watch)
    watcher.start()
    time.sleep(0.1)
    started = time.monotonic()
    for i in range(n):
        a.api(
            "PUT",
            f"/rooms/{quote(room_id)}/send/m.room.message/b{i}",
            {"msgtype": "m.text", "body": f"{prefix}{i:05d}"},
        )
    sent = time.monotonic()
    watcher.join()
    bodies = received_bodies(b, room_id, prefix)
    expected = [f"{prefix}{i:05d}" for i in range(n)]
    result = {
        "messages": n,
        "send_s": round(sent - started, 3),
        "last_visible_s": round(seen_at[0] - started, 3) if seen_last.is_set() else None,
        "after_last_send_s": round(seen_at[0] - sent, 3) if seen_last.is_set() else None,
        "received": len(bodies),
        "distinct": len(set(bodies)),
        "complete_in_order": bodies == expected,
    }
    print(f"burst {label}: {result}", flush=True)
    return result


def big_room(server, members):
    """A room on server with `members` local members (the creator included); registration
    and joins go through the client API, 8 at a time."""
    creator = fresh(server, "Owner")
    room_id = creator.api("POST", "/createRoom", {"preset": "public_chat", "room_version": "11"})["room_id"]
    started = time.monotonic()
    tag = secrets.token_hex(3)

    def member(i):
        c = Client("M", server[0], server[1]).register_fast(f"fb_m{tag}_{i}")
        c.api("POST", f"/join/{quote(room_id)}", {})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(member, range(members - 1)))
    setup_s = time.monotonic() - started
    print(f"big room {room_id}: {members} members in {setup_s:.1f}s", flush=True)
    return room_id, round(setup_s, 1)


def join(room_server, joiner_server, room_id, label):
    joiner, local = fresh(joiner_server, "J"), fresh(joiner_server, "L")
    local_room = local.api("POST", "/createRoom", {"preset": "private_chat"})["room_id"]
    samples = []  # (start, latency ms)
    stop = threading.Event()

    def local_sends():
        i = 0
        while not stop.is_set():
            t = time.monotonic()
            local.api(
                "PUT",
                f"/rooms/{quote(local_room)}/send/m.room.message/l{i}",
                {"msgtype": "m.text", "body": f"local {i}"},
            )
            samples.append((t, (time.monotonic() - t) * 1000))
            i += 1
            time.sleep(max(0, LOCAL_SEND_INTERVAL - (time.monotonic() - t)))

    sender = threading.Thread(target=local_sends)
    sender.start()
    time.sleep(BASELINE_SECONDS)
    started = time.monotonic()
    joiner.api(
        "POST",
        f"/join/{quote(room_id)}",
        {},
        params={"server_name": room_server[1], "via": room_server[1]},
        timeout=300,
    )
    ended = time.monotonic()
    stop.set()
    sender.join()
    members = len(joiner.api("GET", f"/rooms/{quote(room_id)}/joined_members")["joined"])
    before = [ms for (t, ms) in samples if t < started]
    during = [ms for (t, ms) in samples if started <= t < ended]
    result = {
        "join_s": round(ended - started, 3),
        "joined_members_seen": members,
        "local_send_before": stats(before),
        "local_send_during": stats(during),
    }
    print(f"join {label}: {result}", flush=True)
    return result


def main(argv):
    if len(argv) != 11 or argv[1] not in SCALES:
        print(__doc__, file=sys.stderr)
        return 2
    counts = SCALES[argv[1]]
    out = argv[2]
    m1, m2, s1, s2 = ((argv[i], argv[i + 1]) for i in range(3, 11, 2))
    for url, name in (m1, m2, s1, s2):
        require_loopback(name, split_server_name(name)[0])
        require_loopback(url, urllib.parse.urlparse(url).hostname)
    pairs = {
        "Myelin to Myelin": (m1, m2),
        "Myelin to Synapse": (m1, s1),
        "Synapse to Myelin": (s1, m1),
        "Synapse to Synapse": (s1, s2),
    }
    report = {"scale": argv[1], "counts": counts, "latency": {}, "burst": {}, "join": {}}
    for label, (a, b) in pairs.items():
        report["latency"][label] = latency(a, b, label, counts["latency"])
    for label in ("Myelin to Myelin", "Myelin to Synapse", "Synapse to Myelin"):
        a, b = pairs[label]
        report["burst"][label] = burst(a, b, label, counts["burst"])
    room_id, setup_s = big_room(m1, counts["members"])
    report["join"]["members"] = counts["members"]
    report["join"]["setup_s"] = setup_s
    report["join"]["Myelin joins from Myelin"] = join(m1, m2, room_id, "Myelin joins from Myelin")
    report["join"]["Synapse joins from Myelin"] = join(m1, s1, room_id, "Synapse joins from Myelin")
    with open(out, "w") as f:
        json.dump(report, f, indent=2)
    if not all(r["complete_in_order"] for r in report["burst"].values()):
        print("a burst arrived incomplete or out of order", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
