// A real client against a running Myelin: matrix-js-sdk syncs a room holding 200 messages
// with a small initial timeline, receives a live message, then scrolls back to the room's
// creation and checks that it saw every message exactly once, in order.
//
// User A is driven with plain HTTP requests; user B is a matrix-js-sdk client (no crypto).
//
// Usage: node sync_scrollback.mjs http://127.0.0.1:PORT (MYELIN_JS_VERBOSE=1 logs requests)

import { randomBytes } from "node:crypto";
import { Direction, EventType, RoomEvent } from "matrix-js-sdk";

import { harness } from "./harness.mjs";

const MESSAGES = 200;
const verbose = !!process.env.MYELIN_JS_VERBOSE;
const { api, register, check, fail, pass, withTimeout, startClient } = harness("sync");

async function main() {
    const suffix = randomBytes(4).toString("hex");
    const alice = await register(`jsa${suffix}`);
    const bob = await register(`jsb${suffix}`);

    const { room_id: roomId } = await api("POST", "/createRoom", {
        token: alice.access_token,
        body: { preset: "public_chat", name: "js-sdk scrollback" },
    });
    check(typeof roomId === "string" && roomId.startsWith("!"), `A created room ${roomId}`);
    await api("POST", `/join/${encodeURIComponent(roomId)}`, { token: bob.access_token, body: {} });
    console.log("ok - B joined the room");

    let txn = 0;
    const send = (body) =>
        api(
            "PUT",
            `/rooms/${encodeURIComponent(roomId)}/send/m.room.message/js${suffix}-${txn++}`,
            { token: alice.access_token, body: { msgtype: "m.text", body } },
        );
    for (let i = 0; i < MESSAGES; i++) await send(`msg ${i}`);
    console.log(`ok - A sent ${MESSAGES} messages`);

    const client = await startClient(bob, { initialSyncLimit: 10 });

    const room = client.getRoom(roomId);
    check(room !== null, "B's client knows the room after the initial sync");
    const initial = room.getLiveTimeline().getEvents().filter((e) => e.getType() === EventType.RoomMessage);
    check(
        initial.length > 0 && initial.length <= 10 && initial.at(-1).getContent().body === `msg ${MESSAGES - 1}`,
        `initial timeline holds the newest ${initial.length} messages (ends with "msg ${MESSAGES - 1}")`,
    );
    check(
        typeof room.getLiveTimeline().getPaginationToken(Direction.Backward) === "string",
        "the initial timeline is limited and has a backwards pagination token",
    );

    // Live: one more message from A must arrive as a live timeline event.
    const live = new Promise((resolve) => {
        const onTimeline = (event, evRoom, toStartOfTimeline, _removed, data) => {
            if (evRoom?.roomId !== roomId || toStartOfTimeline || !data?.liveEvent) return;
            if (event.getType() === EventType.RoomMessage && event.getContent().body === "live message") {
                client.off(RoomEvent.Timeline, onTimeline);
                resolve(event);
            }
        };
        client.on(RoomEvent.Timeline, onTimeline);
    });
    const liveSent = await send("live message");
    let liveEvent;
    try {
        liveEvent = await withTimeout(live, 10_000, "the live message on Room.timeline");
    } catch (err) {
        fail(err.message);
    }
    check(liveEvent.getId() === liveSent.event_id, "B received the live message as a live Room.timeline event");

    // Scroll back to the room's creation.
    let rounds = 0;
    while (room.oldState.paginationToken !== null) {
        if (++rounds > 40) fail("scrollback did not reach the start of the room in 40 rounds");
        const before = room.getLiveTimeline().getEvents().length;
        try {
            await withTimeout(client.scrollback(room, 50), 15_000, "scrollback");
        } catch (err) {
            fail(`scrollback round ${rounds} failed: ${err.message}`);
        }
        const after = room.getLiveTimeline().getEvents().length;
        if (verbose) console.error(`scrollback round ${rounds}: ${before} -> ${after} events`);
    }
    const events = room.getLiveTimeline().getEvents();
    check(true, `scrollback reached the start after ${rounds} rounds (${events.length} events in the live timeline)`);
    check(events[0]?.getType() === EventType.RoomCreate, `the timeline starts with m.room.create (got ${events[0]?.getType()})`);

    const ids = events.map((e) => e.getId());
    const dupIds = ids.filter((id, i) => ids.indexOf(id) !== i);
    check(dupIds.length === 0, `no event appears twice in the timeline${dupIds.length ? `: ${dupIds.slice(0, 5)}` : ""}`);

    const bodies = events.filter((e) => e.getType() === EventType.RoomMessage).map((e) => e.getContent().body);
    const expected = [...Array.from({ length: MESSAGES }, (_, i) => `msg ${i}`), "live message"];
    const firstDiff = expected.findIndex((b, i) => bodies[i] !== b);
    if (firstDiff !== -1 || bodies.length !== expected.length) {
        const at = firstDiff === -1 ? expected.length : firstDiff;
        fail(
            `message bodies differ from "msg 0".."msg ${MESSAGES - 1}","live message": ` +
                `${bodies.length} messages, expected ${expected.length}; first difference at index ${at}: ` +
                `got ${JSON.stringify(bodies.slice(Math.max(0, at - 2), at + 3))}, ` +
                `expected ${JSON.stringify(expected.slice(Math.max(0, at - 2), at + 3))}`,
        );
    }
    check(true, `the timeline holds "msg 0".."msg ${MESSAGES - 1}","live message" in order, no gap, no duplicate`);

    pass();
}

main().catch((err) => fail(err?.stack || String(err)));
