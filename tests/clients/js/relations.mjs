// Edits, reactions, threads, redactions and search as a new user would try them with
// matrix-js-sdk: an edit shows as one message with the new text on the other side; a second
// identical reaction is refused; a thread's root carries its summary; a redaction empties the
// message for both users; search finds a message by a word in it, and not a message the
// searcher cannot see.
//
// Usage: node relations.mjs http://127.0.0.1:PORT (MYELIN_JS_VERBOSE=1 logs requests)

import { randomBytes } from "node:crypto";
import { EventType } from "matrix-js-sdk";

import { harness } from "./harness.mjs";

const { api, register, check, fail, pass, waitFor, startClient } = harness("relations");
const WAIT_MS = 15_000;

async function main() {
    const suffix = randomBytes(4).toString("hex");
    const aliceSession = await register(`jsla${suffix}`);
    const bobSession = await register(`jslb${suffix}`);
    const eveSession = await register(`jsle${suffix}`);
    const { room_id: roomId } = await api("POST", "/createRoom", {
        token: aliceSession.access_token,
        body: { preset: "public_chat", name: "relations" },
    });
    await api("POST", `/join/${encodeURIComponent(roomId)}`, { token: bobSession.access_token, body: {} });
    const { room_id: eveRoom } = await api("POST", "/createRoom", {
        token: eveSession.access_token,
        body: { preset: "private_chat" },
    });
    await api("PUT", `/rooms/${encodeURIComponent(eveRoom)}/send/m.room.message/p1`, {
        token: eveSession.access_token,
        body: { msgtype: "m.text", body: "eve's private pangolin" },
    });

    const alice = await startClient(aliceSession);
    const bob = await startClient(bobSession);
    await waitFor(() => bob.getRoom(roomId), WAIT_MS, "Bob's client to know the room");
    const bobRoom = bob.getRoom(roomId);

    // An edit: Bob sees one message, with the new text.
    const { event_id: originalId } = await alice.sendTextMessage(roomId, "helo wrold");
    await waitFor(() => bobRoom.findEventById(originalId), WAIT_MS, "Bob to get the message");
    const { event_id: editId } = await alice.sendEvent(roomId, EventType.RoomMessage, {
        msgtype: "m.text",
        body: "* hello world",
        "m.new_content": { msgtype: "m.text", body: "hello world" },
        "m.relates_to": { rel_type: "m.replace", event_id: originalId },
    });
    await waitFor(
        () => bobRoom.findEventById(originalId)?.getContent().body === "hello world",
        WAIT_MS,
        "Bob to see the edited text",
    );
    check(bobRoom.findEventById(originalId).replacingEventId() === editId, "Bob sees the edit applied to the original");

    // Reactions: the second identical one is refused.
    const reaction = { "m.relates_to": { rel_type: "m.annotation", event_id: originalId, key: "👍" } };
    await bob.sendEvent(roomId, EventType.Reaction, reaction);
    let refused = null;
    try {
        await bob.sendEvent(roomId, EventType.Reaction, reaction);
    } catch (err) {
        refused = err;
    }
    check(refused?.errcode === "M_DUPLICATE_ANNOTATION", `a second identical reaction is refused (${refused?.errcode})`);

    // A thread: its root carries the summary.
    const { event_id: rootId } = await alice.sendTextMessage(roomId, "thread root");
    await bob.sendEvent(roomId, EventType.RoomMessage, {
        msgtype: "m.text",
        body: "first reply",
        "m.relates_to": { rel_type: "m.thread", event_id: rootId },
    });
    const { event_id: lastReply } = await bob.sendEvent(roomId, EventType.RoomMessage, {
        msgtype: "m.text",
        body: "second reply",
        "m.relates_to": { rel_type: "m.thread", event_id: rootId },
    });

    // A redaction empties the message for both users.
    const { event_id: doomedId } = await alice.sendTextMessage(roomId, "oops, wrong room");
    await waitFor(() => bobRoom.findEventById(doomedId), WAIT_MS, "Bob to get the doomed message");
    await alice.redactEvent(roomId, doomedId);
    for (const [name, client] of [["Alice", alice], ["Bob", bob]]) {
        await waitFor(
            () => client.getRoom(roomId).findEventById(doomedId)?.isRedacted(),
            WAIT_MS,
            `${name} to see the redaction`,
        );
        check(
            client.getRoom(roomId).findEventById(doomedId).getContent().body === undefined,
            `${name} no longer sees the redacted text`,
        );
    }

    // A client starting now gets the edit and the thread summary bundled in its first sync.
    const bobLater = await startClient(await loginAgain(bobSession), { initialSyncLimit: 30 });
    const laterRoom = bobLater.getRoom(roomId);
    const original = laterRoom.findEventById(originalId);
    check(original?.getContent().body === "hello world", "a new client shows the edited text at once");
    const summary = laterRoom.findEventById(rootId)?.getServerAggregatedRelation("m.thread");
    check(summary?.count === 2, `the thread root carries its reply count (${summary?.count})`);
    check(summary?.latest_event?.event_id === lastReply, "and its latest reply");
    check(summary?.current_user_participated === true, "and that Bob took part");

    // Search: a word finds the message; Eve's private room stays private.
    const found = await bob.searchRoomEvents({ term: "world" });
    const foundBodies = found.results.map((r) => r.context.getEvent().getContent().body);
    check(foundBodies.includes("* hello world"), `search finds the message by a word (${JSON.stringify(foundBodies)})`);
    const hidden = await bob.searchRoomEvents({ term: "pangolin" });
    check(hidden.results.length === 0, "search does not find a message in a room Bob is not in");
    pass();
}

async function loginAgain(session) {
    const baseUrl = process.argv[2].replace(/\/+$/, "");
    const res = await fetch(`${baseUrl}/_matrix/client/v3/login`, {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify({
            type: "m.login.password",
            identifier: { type: "m.id.user", user: session.user_id },
            password: "correct horse battery staple",
        }),
    });
    return res.json();
}

main().catch((err) => fail(err?.stack || String(err)));
