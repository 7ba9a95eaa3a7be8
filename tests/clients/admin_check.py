"""The Synapse admin API as synapse-admin and Ketesa call it, against a running homeserver:
the requests in the UIs' forms (query parameters, raw or encoded IDs, DELETE with a JSON body,
the whole record sent back on an edit) and asserts on the response shapes (field names and
JSON types, paging tokens' types, status codes). tests/federation/run_interop.sh runs the same
script against Synapse from PyPI, so every assertion here is one Synapse passes too: the shapes
are Synapse's.

Usage: admin_check.py http://127.0.0.1:PORT
Environment: ADMIN_USER and ADMIN_PASSWORD, a local server admin that can log in with a
password (tests/run.sh makes one with `myelin user create --admin`, run_interop.sh with
Synapse's register_new_matrix_user). Other users are made with PUT /_synapse/admin/v2/users.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

BASE = ""


def check(condition, message):
    if not condition:
        raise SystemExit(f"FAIL: {message}")
    print(f"ok - {message}")


def call(method, path, token=None, body=None, raw=None, content_type=None):
    """One request; returns (status, parsed JSON body)."""
    headers = {}
    data = None
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    if raw is not None:
        data = raw
        headers["Content-Type"] = content_type
    req = urllib.request.Request(BASE + path, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        text = e.read()
        try:
            return e.code, json.loads(text)
        except ValueError:
            return e.code, {"_raw": text.decode(errors="replace")}


def ok(method, path, token=None, body=None, status=200, **kw):
    got, resp = call(method, path, token, body, **kw)
    if got != status:
        raise SystemExit(f"FAIL: {method} {path}: expected {status}, got {got}: {resp}")
    return resp


def q(value):
    """Percent-encodes a path segment as the UIs do for user IDs (encodeURIComponent)."""
    return urllib.parse.quote(value, safe="")


def types(obj, spec, what):
    """Every field in spec is present with one of the given JSON types (None = null)."""
    for field, allowed in spec.items():
        allowed = allowed if isinstance(allowed, tuple) else (allowed,)
        check(field in obj, f"{what}: has {field}")
        value = obj[field]
        good = any(
            (value is None) if t is None
            else (isinstance(value, t) and not (t is int and isinstance(value, bool)))
            for t in allowed
        )
        if not good:
            raise SystemExit(f"FAIL: {what}: {field} = {value!r} is not {allowed}")


def login(user, password):
    resp = ok("POST", "/_matrix/client/v3/login", body={
        "type": "m.login.password", "identifier": {"type": "m.id.user", "user": user},
        "password": password, "initial_device_display_name": "admin_check"})
    return resp["access_token"], resp["user_id"]


USER_LIST_ENTRY = {
    "name": str, "is_guest": bool, "admin": bool, "user_type": (str, None),
    "deactivated": bool, "shadow_banned": bool, "displayname": (str, None),
    "avatar_url": (str, None), "creation_ts": int, "locked": bool,
}
USER_DETAILS = {
    "name": str, "displayname": (str, None), "threepids": list, "avatar_url": (str, None),
    "is_guest": bool, "admin": bool, "deactivated": bool, "erased": bool,
    "shadow_banned": bool, "creation_ts": int, "appservice_id": (str, None),
    "external_ids": list, "user_type": (str, None), "locked": bool,
}
ROOM_LIST_ENTRY = {
    "room_id": str, "name": (str, None), "canonical_alias": (str, None),
    "joined_members": int, "joined_local_members": int, "version": str, "creator": str,
    "encryption": (str, None), "federatable": bool, "public": bool, "join_rules": (str, None),
    "guest_access": (str, None), "history_visibility": (str, None), "state_events": int,
    "room_type": (str, None),
}


def main():
    admin_user, admin_password = os.environ["ADMIN_USER"], os.environ["ADMIN_PASSWORD"]

    # The login probe: unauthenticated, a string.
    version = ok("GET", "/_synapse/admin/v1/server_version")
    types(version, {"server_version": str}, "server_version (no token)")

    admin, admin_id = login(admin_user, admin_password)
    server_name = admin_id.split(":", 1)[1]  # the part after the first colon, ports included
    tag = f"shape{int(time.time() * 1000)}"
    alice_id, bob_id = f"@{tag}a:{server_name}", f"@{tag}b:{server_name}"

    # Create (201) and modify (200) with PUT v2, as the create and edit forms send them.
    created = ok("PUT", f"/_synapse/admin/v2/users/{q(alice_id)}", admin,
                 {"password": "pw-pw-pw-1", "displayname": "Alice Shape", "admin": False},
                 status=201)
    types(created, USER_DETAILS, "PUT v2 user (create) answers the details")
    check(created["name"] == alice_id and created["displayname"] == "Alice Shape",
          "the created user has the given name and displayname")
    ok("PUT", f"/_synapse/admin/v2/users/{q(bob_id)}", admin,
       {"password": "pw-pw-pw-2", "displayname": "Bob Shape"}, status=201)
    # An edit save sends the whole record back, UI-only fields included.
    record = dict(created, id=alice_id, avatar_src=None, creation_ts_ms=1, displayname="Alice S")
    record = {k: v for k, v in record.items() if v is not None}
    modified = ok("PUT", f"/_synapse/admin/v2/users/{q(alice_id)}", admin, record)
    check(modified["displayname"] == "Alice S", "PUT v2 user (modify, whole record): 200")

    # A non-admin gets 403 M_FORBIDDEN on admin endpoints.
    alice, _ = login(alice_id, "pw-pw-pw-1")
    bob, _ = login(bob_id, "pw-pw-pw-2")
    status, resp = call("GET", "/_synapse/admin/v2/users", alice)
    check(status == 403 and resp.get("errcode") == "M_FORBIDDEN",
          "a non-admin token: 403 M_FORBIDDEN")

    details = ok("GET", f"/_synapse/admin/v2/users/{q(alice_id)}", admin)
    types(details, USER_DETAILS, "GET v2 user")
    check(details["admin"] is False and details["deactivated"] is False
          and details["user_type"] is None, "GET v2 user: admin, deactivated, user_type")
    # Synapse's quirk the original UI relies on: seconds here, milliseconds in the list.
    check(1_000_000_000 < details["creation_ts"] < 100_000_000_000,
          "GET v2 user: creation_ts in seconds")
    status, resp = call("GET", f"/_synapse/admin/v2/users/{q('@nobody_' + tag + ':' + server_name)}",
                        admin)
    check(status == 404 and resp.get("errcode") == "M_NOT_FOUND", "unknown user: 404 M_NOT_FOUND")

    # The users list as synapse-admin asks for it: paged, by name, filtered.
    listing = f"from=0&limit=1&name={tag}&guests=false&deactivated=false&order_by=name&dir=f"
    page = ok("GET", f"/_synapse/admin/v2/users?{listing}", admin)
    types(page, {"users": list, "total": int, "next_token": str}, "v2 users list")
    check(page["total"] == 2 and len(page["users"]) == 1, "v2 users: total 2, one per page")
    check(page["next_token"] == "1", "v2 users: next_token is the string offset")
    types(page["users"][0], USER_LIST_ENTRY, "v2 users entry")
    check(page["users"][0]["name"] == alice_id, "v2 users: ordered by name ascending")
    check(page["users"][0]["creation_ts"] > 100_000_000_000, "v2 users: creation_ts in ms")
    last = ok("GET", f"/_synapse/admin/v2/users?from=1&limit=1&name={tag}&order_by=name&dir=f",
              admin)
    check(last["users"][0]["name"] == bob_id and "next_token" not in last,
          "v2 users: the last page has no next_token")
    backwards = ok("GET", f"/_synapse/admin/v2/users?from=0&limit=10&name={tag}"
                   "&order_by=displayname&dir=b", admin)
    check([u["name"] for u in backwards["users"]] == [bob_id, alice_id],
          "v2 users: order_by=displayname&dir=b")
    # Ketesa's list is v3, where deactivated is a tri-state filter.
    v3 = ok("GET", f"/_synapse/admin/v3/users?from=0&limit=10&name={tag}&order_by=name&dir=f",
            admin)
    types(v3, {"users": list, "total": int}, "v3 users list")
    check(v3["total"] == 2, "v3 users: both users")

    # Devices, whois, rooms of a user.
    devices = ok("GET", f"/_synapse/admin/v2/users/{q(alice_id)}/devices", admin)
    types(devices, {"devices": list, "total": int}, "devices list")
    check(devices["total"] >= 1, "devices: alice's login device is listed")
    types(devices["devices"][0], {"device_id": str, "display_name": (str, None),
                                  "last_seen_ts": (int, None), "user_id": str},
          "devices entry")
    whois = ok("GET", f"/_synapse/admin/v1/whois/{q(alice_id)}", admin)
    types(whois, {"user_id": str, "devices": dict}, "whois")

    room = ok("POST", "/_matrix/client/v3/createRoom", alice,
              {"name": f"{tag} room one", "preset": "public_chat", "invite": [bob_id]})["room_id"]
    ok("POST", f"/_matrix/client/v3/join/{q(room)}", bob)
    room2 = ok("POST", "/_matrix/client/v3/createRoom", alice,
               {"name": f"{tag} room two"})["room_id"]
    joined = ok("GET", f"/_synapse/admin/v1/users/{q(alice_id)}/joined_rooms", admin)
    types(joined, {"joined_rooms": list, "total": int}, "joined_rooms")
    check(sorted(joined["joined_rooms"]) == sorted([room, room2]) and joined["total"] == 2,
          "joined_rooms: both rooms")
    memberships = ok("GET", f"/_synapse/admin/v1/users/{q(bob_id)}/memberships", admin)
    types(memberships, {"memberships": dict}, "memberships")
    check(memberships["memberships"] == {room: "join"}, "memberships: room ID to membership")

    # The rooms list: search, order, page.
    rooms = ok("GET", f"/_synapse/admin/v1/rooms?search_term={tag}&order_by=name&dir=f"
               "&from=0&limit=1", admin)
    types(rooms, {"rooms": list, "offset": int, "total_rooms": int, "next_batch": int},
          "rooms list")
    check(rooms["total_rooms"] == 2 and rooms["offset"] == 0 and rooms["next_batch"] == 1,
          "rooms list: total_rooms, offset and an integer next_batch")
    types(rooms["rooms"][0], ROOM_LIST_ENTRY, "rooms entry")
    check(rooms["rooms"][0]["room_id"] == room, "rooms list: ordered by name")
    check(rooms["rooms"][0]["joined_members"] == 2 and rooms["rooms"][0]["public"] is False,
          "rooms entry: joined_members 2, not in the directory")
    rooms = ok("GET", f"/_synapse/admin/v1/rooms?search_term={tag}&order_by=name&dir=f"
               "&from=1&limit=1", admin)
    check(rooms["rooms"][0]["room_id"] == room2 and rooms["prev_batch"] == 0
          and "next_batch" not in rooms, "rooms list: the last page, prev_batch 0")
    # Sizes sort largest first; dir=b turns that round.
    by_size = ok("GET", f"/_synapse/admin/v1/rooms?search_term={tag}&order_by=joined_members"
                 "&dir=f", admin)
    check([r["room_id"] for r in by_size["rooms"]] == [room, room2],
          "rooms list: order_by=joined_members&dir=f, largest first")
    by_size = ok("GET", f"/_synapse/admin/v1/rooms?search_term={tag}&order_by=joined_members"
                 "&dir=b", admin)
    check([r["room_id"] for r in by_size["rooms"]] == [room2, room],
          "rooms list: order_by=joined_members&dir=b, smallest first")

    # One room, its members and state; room IDs go raw in these paths, as the UIs send them.
    info = ok("GET", f"/_synapse/admin/v1/rooms/{room}", admin)
    types(info, dict(ROOM_LIST_ENTRY, topic=(str, None), avatar=(str, None),
                     joined_local_devices=int, forgotten=bool), "room details")
    check(info["name"] == f"{tag} room one" and info["creator"] == alice_id,
          "room details: name and creator")
    members = ok("GET", f"/_synapse/admin/v1/rooms/{room}/members", admin)
    types(members, {"members": list, "total": int}, "room members")
    check(sorted(members["members"]) == sorted([alice_id, bob_id]) and members["total"] == 2,
          "room members: both")
    state = ok("GET", f"/_synapse/admin/v1/rooms/{room}/state", admin)
    types(state, {"state": list}, "room state")
    check(any(e["type"] == "m.room.create" for e in state["state"])
          and all({"type", "state_key", "sender", "content", "event_id"} <= e.keys()
                  for e in state["state"]), "room state: client-format state events")

    # Event reports after a client report.
    sent = []
    for i in range(2):
        sent.append(ok("PUT", f"/_matrix/client/v3/rooms/{q(room)}/send/m.room.message/{tag}{i}",
                       bob, {"msgtype": "m.text", "body": f"report me {i}"})["event_id"])
        ok("POST", f"/_matrix/client/v3/rooms/{q(room)}/report/{q(sent[-1])}", alice,
           {"reason": f"spam {i}", "score": -100})
    reports = ok("GET", f"/_synapse/admin/v1/event_reports?from=0&limit=1&dir=b"
                 f"&room_id={q(room)}", admin)
    types(reports, {"event_reports": list, "total": int, "next_token": int}, "event reports")
    check(reports["total"] == 2 and reports["next_token"] == 1,
          "event reports: total 2, an integer next_token")
    report = reports["event_reports"][0]
    types(report, {"id": int, "received_ts": int, "room_id": str, "name": (str, None),
                   "event_id": str, "user_id": str, "reason": (str, None),
                   "score": (int, None), "sender": str, "canonical_alias": (str, None)},
          "event report entry")
    check(report["event_id"] == sent[1] and report["user_id"] == alice_id
          and report["sender"] == bob_id and report["score"] == -100,
          "event reports: newest first (dir=b), reporter and sender")
    one = ok("GET", f"/_synapse/admin/v1/event_reports/{report['id']}", admin)
    # The event as stored (the PDU: room versions 3 and later carry no event_id in it).
    check(one["event_json"]["content"]["body"] == "report me 1"
          and one["event_json"]["sender"] == bob_id, "one event report carries event_json")
    check(ok("DELETE", f"/_synapse/admin/v1/event_reports/{report['id']}", admin) == {},
          "event report delete: {}")

    # Registration tokens.
    token = ok("POST", "/_synapse/admin/v1/registration_tokens/new", admin,
               {"token": tag, "uses_allowed": 5})
    types(token, {"token": str, "uses_allowed": (int, None), "pending": int, "completed": int,
                  "expiry_time": (int, None)}, "new registration token")
    check(token["token"] == tag and token["uses_allowed"] == 5 and token["pending"] == 0,
          "new registration token: as asked")
    generated = ok("POST", "/_synapse/admin/v1/registration_tokens/new", admin, {})
    check(len(generated["token"]) == 16 and generated["uses_allowed"] is None,
          "registration token with no body: 16 characters, unlimited")
    tokens = ok("GET", "/_synapse/admin/v1/registration_tokens", admin)
    types(tokens, {"registration_tokens": list}, "registration tokens list")
    check(tag in [t["token"] for t in tokens["registration_tokens"]], "the list has the token")
    check(ok("DELETE", f"/_synapse/admin/v1/registration_tokens/{tag}", admin) == {},
          "registration token delete: {}")
    ok("DELETE", f"/_synapse/admin/v1/registration_tokens/{generated['token']}", admin)
    status, resp = call("DELETE", f"/_synapse/admin/v1/registration_tokens/{tag}", admin)
    check(status == 404 and resp.get("errcode") == "M_NOT_FOUND", "deleted token: 404")

    # Rate-limit override.
    path = f"/_synapse/admin/v1/users/{q(bob_id)}/override_ratelimit"
    check(ok("GET", path, admin) == {}, "override_ratelimit unset: {}")
    limits = {"messages_per_second": 0, "burst_count": 0}
    check(ok("POST", path, admin, limits) == limits, "override_ratelimit set: echoes it")
    check(ok("GET", path, admin) == limits, "override_ratelimit get: the override")
    check(ok("DELETE", path, admin) == {}, "override_ratelimit delete: {}")
    check(ok("GET", path, admin) == {}, "override_ratelimit after delete: {}")

    # Shadow ban (POST without a body, as the UI sends it).
    path = f"/_synapse/admin/v1/users/{q(bob_id)}/shadow_ban"
    check(ok("POST", path, admin) == {}, "shadow_ban: {}")
    check(ok("GET", f"/_synapse/admin/v2/users/{q(bob_id)}", admin)["shadow_banned"] is True,
          "the user shows shadow_banned")
    check(ok("DELETE", path, admin) == {}, "shadow_ban lifted: {}")

    # A user's media.
    upload = ok("POST", "/_matrix/media/v3/upload?filename=shape.txt", alice,
                raw=b"hello shapes", content_type="text/plain")
    media_id = upload["content_uri"].rsplit("/", 1)[1]
    media = ok("GET", f"/_synapse/admin/v1/users/{q(alice_id)}/media?from=0&limit=10"
               "&order_by=created_ts&dir=b", admin)
    types(media, {"media": list, "total": int}, "user media list")
    check(media["total"] == 1 and media["media"][0]["media_id"] == media_id, "user media: one")
    types(media["media"][0], {"created_ts": int, "last_access_ts": (int, None),
                              "media_id": str, "media_length": int, "media_type": str,
                              "quarantined_by": (str, None), "safe_from_quarantine": bool,
                              "upload_name": (str, None)}, "user media entry")
    check(media["media"][0]["media_length"] == 12 and media["media"][0]["upload_name"]
          == "shape.txt", "user media: length and name")

    # Delete a room (v2, in the background) and poll its status as the UI does.
    delete = ok("DELETE", f"/_synapse/admin/v2/rooms/{room2}", admin,
                {"block": False, "purge": True})
    types(delete, {"delete_id": str}, "room delete v2")
    for _ in range(100):
        status = ok("GET", f"/_synapse/admin/v2/rooms/delete_status/{delete['delete_id']}",
                    admin)
        if status["status"] in ("complete", "failed"):
            break
        time.sleep(0.1)
    types(status, {"delete_id": str, "room_id": str, "status": str, "shutdown_room": dict},
          "delete_status")
    check(status["status"] == "complete" and status["room_id"] == room2,
          "delete_status: complete")
    types(status["shutdown_room"], {"kicked_users": list, "failed_to_kick_users": list,
                                    "local_aliases": list, "new_room_id": (str, None)},
          "delete_status shutdown_room")
    check(status["shutdown_room"]["kicked_users"] == [alice_id], "the room's member was kicked")
    by_room = ok("GET", f"/_synapse/admin/v2/rooms/{room2}/delete_status", admin)
    types(by_room, {"results": list}, "delete_status by room")
    check(by_room["results"][0]["delete_id"] == delete["delete_id"], "delete_status by room")

    # Deactivate: the answer, then the user shows deactivated and leaves the v2 list.
    resp = ok("POST", f"/_synapse/admin/v1/deactivate/{q(bob_id)}", admin, {"erase": False})
    types(resp, {"id_server_unbind_result": str}, "deactivate")
    gone = ok("GET", f"/_synapse/admin/v2/users/{q(bob_id)}", admin)
    check(gone["deactivated"] is True and gone["erased"] is False,
          "the user shows deactivated, not erased")
    check(gone["displayname"] == "Bob Shape", "without erase the displayname stays")
    listed = ok("GET", f"/_synapse/admin/v2/users?name={tag}&deactivated=false", admin)
    check([u["name"] for u in listed["users"]] == [alice_id], "v2 list drops deactivated users")
    listed = ok("GET", f"/_synapse/admin/v2/users?name={tag}&deactivated=true", admin)
    check(listed["total"] == 2, "v2 list with deactivated=true includes them")
    only = ok("GET", f"/_synapse/admin/v3/users?name={tag}&deactivated=true", admin)
    check([u["name"] for u in only["users"]] == [bob_id], "v3 deactivated=true: only them")
    # With erase the profile goes and the user is marked erased (the UI sends the empty body
    # form for a plain deactivation, {"erase": true} for an erasure).
    ok("POST", f"/_synapse/admin/v1/deactivate/{q(alice_id)}", admin, {"erase": True})
    erased = ok("GET", f"/_synapse/admin/v2/users/{q(alice_id)}", admin)
    check(erased["deactivated"] is True and erased["erased"] is True
          and erased["displayname"] is None, "deactivate with erase: profile gone, erased")
    print("admin API shapes: all checks passed")


if __name__ == "__main__":
    BASE = sys.argv[1].rstrip("/")
    main()
