// A real client against a running Myelin: matrix-js-sdk syncs a room holding 200 messages
// with a small initial timeline, receives a live message, then scrolls back to the room's
// creation and checks that it saw every message exactly once, in order.
//
// User A is driven with plain HTTP requests; user B is a matrix-js-sdk client (no crypto).
//
// Usage: node sync_scrollback.mjs http://127.0.0.1:PORT
// Set MYELIN_JS_VERBOSE=1 to log every request the SDK makes and the SDK's own debug log.

import { randomBytes } from "node:crypto";
import {
    ClientEvent,
    Direction,
    EventType,
    RoomEvent,
    SyncState,
    createClient,
} from "matrix-js-sdk";
import { logger } from "matrix-js-sdk/lib/logger.js";

const TOTAL_TIMEOUT_MS = 120_000;
const MESSAGES = 200;
const verbose = !!process.env.MYELIN_JS_VERBOSE;

const baseUrl = (process.argv[2] || "").replace(/\/+$/, "");
if (!baseUrl) {
    console.error("usage: node sync_scrollback.mjs http://127.0.0.1:PORT");
    process.exit(2);
}

logger.setLevel(verbose ? "debug" : "warn", false);

const hardTimeout = setTimeout(() => {
    console.error(`FAIL: overall timeout of ${TOTAL_TIMEOUT_MS / 1000} s reached`);
    console.log("js-sdk sync: 0 passed, 1 failed");
    process.exit(1);
}, TOTAL_TIMEOUT_MS);

let client = null;

function fail(message) {
    console.error(`FAIL: ${message}`);
    try {
        client?.stopClient();
    } catch {
        // ignore: we are failing anyway
    }
    console.log("js-sdk sync: 0 passed, 1 failed");
    process.exit(1);
}

function check(condition, message) {
    if (!condition) fail(message);
    console.log(`ok - ${message}`);
}

// Plain client-server API calls (user A, registration).
async function api(method, path, { token, body } = {}) {
    const headers = { "Content-Type": "application/json" };
    if (token) headers.Authorization = `Bearer ${token}`;
    const res = await fetch(`${baseUrl}/_matrix/client/v3${path}`, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    let json;
    try {
        json = JSON.parse(text);
    } catch {
        json = undefined;
    }
    if (!res.ok || json === undefined) {
        fail(`${method} ${path} answered ${res.status}: ${text.slice(0, 500)}`);
    }
    return json;
}

async function register(username) {
    const res = await api("POST", "/register", {
        body: {
            username,
            password: "correct horse battery staple",
            auth: { type: "m.login.dummy" },
            initial_device_display_name: "js-sdk test",
        },
    });
    check(res.user_id && res.access_token && res.device_id, `register ${username} -> ${res.user_id}`);
    return res;
}

// The SDK's requests go through this fetch so failures can be pinned on one request.
const sdkErrors = [];
async function loggingFetch(input, init = {}) {
    const url = typeof input === "string" ? input : input instanceof URL ? input.href : input.url;
    const method = init.method || "GET";
    const shortUrl = url.replace(baseUrl, "").replace(/access_token=[^&]*/, "access_token=…");
    let res;
    try {
        res = await fetch(input, init);
    } catch (err) {
        if (verbose || err?.name !== "AbortError") console.error(`sdk: ${method} ${shortUrl} -> ${err}`);
        throw err;
    }
    if (verbose) console.error(`sdk: ${method} ${shortUrl} -> ${res.status}`);
    if (!res.ok) {
        const body = await res.clone().text();
        sdkErrors.push(`${method} ${shortUrl} -> ${res.status} ${body.slice(0, 300)}`);
        if (verbose) console.error(`sdk:   ${body.slice(0, 300)}`);
    }
    return res;
}

function withTimeout(promise, ms, what) {
    let timer;
    return Promise.race([
        promise,
        new Promise((_, reject) => {
            timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
        }),
    ]).finally(() => clearTimeout(timer));
}

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

    client = createClient({
        baseUrl,
        accessToken: bob.access_token,
        userId: bob.user_id,
        deviceId: bob.device_id,
        fetchFn: loggingFetch,
        timelineSupport: true,
    });

    const ready = new Promise((resolve, reject) => {
        const onSync = (state, _prev, data) => {
            if (state === SyncState.Prepared || state === SyncState.Syncing) {
                client.off(ClientEvent.Sync, onSync);
                resolve(state);
            } else if (state === SyncState.Error) {
                client.off(ClientEvent.Sync, onSync);
                reject(new Error(`sync state ERROR: ${data?.error ?? "(no error given)"}`));
            }
        };
        client.on(ClientEvent.Sync, onSync);
    });
    await client.startClient({ initialSyncLimit: 10 });
    let state;
    try {
        state = await withTimeout(ready, 30_000, "sync state PREPARED");
    } catch (err) {
        fail(`${err.message}\nfailed SDK requests:\n  ${sdkErrors.join("\n  ") || "(none)"}`);
    }
    check(true, `B's client reached sync state ${state}`);

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
        fail(`${err.message}\nfailed SDK requests:\n  ${sdkErrors.join("\n  ") || "(none)"}`);
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
            fail(
                `scrollback round ${rounds} failed: ${err.message}\nfailed SDK requests:\n  ${
                    sdkErrors.join("\n  ") || "(none)"
                }`,
            );
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

    client.stopClient();
    client = null;
    clearTimeout(hardTimeout);
    console.log("js-sdk sync: 1 passed, 0 failed");
    // Exit explicitly: an aborted long-poll or keep-alive socket must not keep node alive.
    process.exit(0);
}

main().catch((err) => fail(err?.stack || String(err)));
