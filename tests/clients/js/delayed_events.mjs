// Delayed events (MSC4140) as Element Call uses them, through matrix-js-sdk: a delayed state
// event fires after its delay and reaches the other member; a cancelled one never does; the
// scheduled one is listed until it fires. (The server must run with MYELIN_MAX_EVENT_DELAY_MS;
// a delayed event firing across a restart is in tests/integration/delayed_events.rs.)
//
// Usage: node delayed_events.mjs http://127.0.0.1:PORT (MYELIN_JS_VERBOSE=1 logs requests)

import { randomBytes } from "node:crypto";
import { UpdateDelayedEventAction } from "matrix-js-sdk";

import { harness } from "./harness.mjs";

const { api, register, check, fail, pass, waitFor, startClient } = harness("delayed_events");
const WAIT_MS = 15_000;
const TYPE = "org.example.call.member";

async function main() {
    const suffix = randomBytes(4).toString("hex");
    const aliceSession = await register(`jsda${suffix}`);
    const bobSession = await register(`jsdb${suffix}`);
    const { room_id: roomId } = await api("POST", "/createRoom", {
        token: aliceSession.access_token,
        body: { preset: "public_chat", power_level_content_override: { state_default: 0 } },
    });
    await api("POST", `/join/${encodeURIComponent(roomId)}`, { token: bobSession.access_token, body: {} });

    const alice = await startClient(aliceSession);
    const bob = await startClient(bobSession);
    await waitFor(() => bob.getRoom(roomId), WAIT_MS, "Bob's client to know the room");
    const stateOf = (key) => bob.getRoom(roomId).currentState.getStateEvents(TYPE, key)?.getContent();

    const fires = await alice._unstable_sendDelayedStateEvent(
        roomId,
        { delay: 1500 },
        TYPE,
        { membership: "left" },
        "fires",
    );
    const cancelled = await alice._unstable_sendDelayedStateEvent(
        roomId,
        { delay: 1500 },
        TYPE,
        { membership: "never" },
        "cancelled",
    );
    check(fires.delay_id && cancelled.delay_id, "two delayed state events are scheduled");
    await alice._unstable_updateDelayedEvent(cancelled.delay_id, UpdateDelayedEventAction.Cancel);
    const listed = await alice._unstable_getDelayedEvents();
    const ids = listed.delayed_events.map((e) => e.delay_id);
    check(
        ids.length === 1 && ids[0] === fires.delay_id,
        `only the uncancelled one is listed (${JSON.stringify(ids)})`,
    );
    check(stateOf("fires") === undefined, "nothing is sent before the delay");

    await waitFor(() => stateOf("fires")?.membership === "left", WAIT_MS, "the delayed state to reach Bob");
    check(true, "the delayed state event fired after its delay and reached Bob");
    await new Promise((resolve) => setTimeout(resolve, 1500));
    check(stateOf("cancelled") === undefined, "the cancelled delayed state event never fired");
    const after = await alice._unstable_getDelayedEvents();
    check(after.delayed_events.length === 0, "nothing is left scheduled");
    pass();
}

main().catch((err) => fail(err.stack || String(err)));
