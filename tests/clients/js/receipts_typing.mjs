// Two users with matrix-js-sdk see each other's public receipts and typing; a private
// receipt reaches only the owner's second device; the unread badge (notification count)
// drops to 0 exactly when the receipt for the last message is sent.
//
// Usage: node receipts_typing.mjs http://127.0.0.1:PORT (MYELIN_JS_VERBOSE=1 logs requests)

import { randomBytes } from "node:crypto";
import { EventType, NotificationCountType, ReceiptType, RoomMemberEvent } from "matrix-js-sdk";

import { harness } from "./harness.mjs";

const { api, register, login, check, pass, waitFor, startClient } = harness("receipts");
const WAIT_MS = 15_000;

async function main() {
    const suffix = randomBytes(4).toString("hex");
    const aliceSession = await register(`jsra${suffix}`);
    const bobSession = await register(`jsrb${suffix}`);
    const bobSecondSession = await login(bobSession.user_id);
    const { room_id: roomId } = await api("POST", "/createRoom", {
        token: aliceSession.access_token,
        body: { preset: "public_chat", name: "receipts and typing" },
    });
    await api("POST", `/join/${encodeURIComponent(roomId)}`, { token: bobSession.access_token, body: {} });

    const alice = await startClient(aliceSession);
    const bob = await startClient(bobSession);
    const bobSecond = await startClient(bobSecondSession);
    await waitFor(() => bob.getRoom(roomId) && alice.getRoom(roomId), WAIT_MS, "both clients to know the room");
    const aliceRoom = alice.getRoom(roomId);
    const bobRoom = bob.getRoom(roomId);

    // Typing, both ways.
    await alice.sendTyping(roomId, true, 30_000);
    await waitFor(() => bobRoom.getMember(aliceSession.user_id)?.typing, WAIT_MS, "Bob to see Alice typing");
    check(true, "Bob sees Alice typing");
    const stopped = new Promise((resolve) => {
        bob.on(RoomMemberEvent.Typing, (_event, member) => {
            if (member.userId === aliceSession.user_id && !member.typing) resolve();
        });
    });
    await alice.sendTyping(roomId, false, 0);
    await stopped;
    check(true, "Bob sees Alice stop typing");
    await bob.sendTyping(roomId, true, 30_000);
    await waitFor(() => aliceRoom.getMember(bobSession.user_id)?.typing, WAIT_MS, "Alice to see Bob typing");
    check(true, "Alice sees Bob typing");
    await bob.sendTyping(roomId, false, 0);

    // Three messages from Alice: Bob's badge counts them.
    const sent = [];
    for (const body of ["one", "two", "three"]) {
        sent.push((await alice.sendTextMessage(roomId, body)).event_id);
    }
    const badge = () => bobRoom.getUnreadNotificationCount(NotificationCountType.Total);
    await waitFor(() => badge() === 3, WAIT_MS, `Bob's badge to reach 3 (it is ${badge()})`);
    check(true, "Bob's unread badge is 3 after three messages");

    // A public receipt for the second message: Alice sees it, Bob's badge drops to 1.
    const eventOf = (room, id) => room.findEventById(id);
    await waitFor(() => eventOf(bobRoom, sent[2]), WAIT_MS, "Bob to have the messages");
    await bob.sendReadReceipt(eventOf(bobRoom, sent[1]), ReceiptType.Read);
    await waitFor(
        () => aliceRoom.getEventReadUpTo(bobSession.user_id, true) === sent[1],
        WAIT_MS,
        "Alice to see Bob's public receipt",
    );
    check(true, "Alice sees Bob's public read receipt on the second message");
    await waitFor(() => badge() === 1, WAIT_MS, `Bob's badge to drop to 1 (it is ${badge()})`);
    check(true, "Bob's badge is 1 with one message left unread");

    // The receipt for the last message takes the badge to exactly 0.
    await bob.sendReadReceipt(eventOf(bobRoom, sent[2]), ReceiptType.Read);
    await waitFor(() => badge() === 0, WAIT_MS, `Bob's badge to reach 0 (it is ${badge()})`);
    check(true, "Bob's badge is 0 once the last message is read");
    await waitFor(
        () => aliceRoom.getEventReadUpTo(bobSession.user_id, true) === sent[2],
        WAIT_MS,
        "Alice to see Bob's receipt on the last message",
    );

    // A private receipt: Bob's second device sees it, Alice never does.
    const fourth = (await alice.sendTextMessage(roomId, "four")).event_id;
    await waitFor(() => badge() === 1, WAIT_MS, `Bob's badge to count the fourth message (${badge()})`);
    await bob.sendReadReceipt(eventOf(bobRoom, fourth), ReceiptType.ReadPrivate);
    const bobSecondRoom = bobSecond.getRoom(roomId);
    await waitFor(
        () => bobSecondRoom.getEventReadUpTo(bobSession.user_id, true) === fourth,
        WAIT_MS,
        "Bob's second device to see his private receipt",
    );
    check(true, "Bob's second device sees his private receipt");
    await waitFor(() => badge() === 0, WAIT_MS, `a private receipt to clear the badge (${badge()})`);
    check(true, "a private receipt clears the badge too");
    // Bob writes after the private receipt; once Alice has that message she has had every
    // receipt committed before it, so a leak would show now.
    const marker = (await bob.sendTextMessage(roomId, "marker")).event_id;
    await waitFor(() => eventOf(aliceRoom, marker), WAIT_MS, "Alice to get Bob's marker message");
    const leaked = aliceRoom
        .getReceiptsForEvent(eventOf(aliceRoom, fourth))
        .filter((r) => r.userId === bobSession.user_id && r.type === ReceiptType.ReadPrivate);
    check(leaked.length === 0, "Alice never receives Bob's private receipt");
    check(
        aliceRoom.getLiveTimeline().getEvents().every((e) => e.getType() !== EventType.Receipt),
        "receipts never appear in the timeline",
    );
    pass();
}

main().catch((err) => {
    console.error(err?.stack || String(err));
    process.exit(1);
});
