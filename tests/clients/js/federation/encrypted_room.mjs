// An encrypted room across servers with matrix-js-sdk's Rust crypto: alice on server A creates
// a room with m.room.encryption and invites bob on server B, who joins through A. Each sends
// an encrypted m.room.message and the other's client decrypts it: the Megolm room key goes
// out as Olm-encrypted to-device messages (over federation as m.direct_to_device), after the
// sender's crypto found the other device through /keys/query and claimed a one-time key
// through /keys/claim, both crossing servers.
//
//   node encrypted_room.mjs http://A-client-api http://B-client-api

import { EventType } from "matrix-js-sdk";
import { harness } from "../harness.mjs";

const [urlA, urlB] = process.argv.slice(2);
if (!urlA || !urlB) {
    console.error("usage: node encrypted_room.mjs http://A-client-api http://B-client-api");
    process.exit(2);
}
const a = harness("federation_encrypted_room", { baseUrl: urlA, totalTimeoutMs: 180_000 });
const b = harness("federation_encrypted_room", { baseUrl: urlB, totalTimeoutMs: 180_000 });
const WAIT_MS = 60_000;
const suffix = Math.random().toString(36).slice(2, 10);

// The decrypted body of an event in a client's room, once it has decrypted it.
function clearBody(client, roomId, eventId) {
    const event = client.getRoom(roomId)?.findEventById(eventId);
    if (!event || event.isBeingDecrypted() || event.isDecryptionFailure()) return undefined;
    return event.getType() === EventType.RoomMessage ? event.getContent().body : undefined;
}

// Waits until `client`'s crypto has a device of `userId`, as a client does before it encrypts
// to a new member: a device whose keys were still being uploaded when its user joined is
// announced by its server afterwards. (Sending earlier shares the room key with nobody, and
// keys are not shared again for messages already sent.)
async function waitForDevice(harness, client, userId) {
    const deadline = Date.now() + WAIT_MS;
    for (;;) {
        const devices = await client.getCrypto().getUserDeviceInfo([userId], true);
        if ((devices.get(userId)?.size ?? 0) > 0) return;
        if (Date.now() > deadline) harness.fail(`timed out after ${WAIT_MS} ms waiting for a device of ${userId}`);
        await new Promise((resolve) => setTimeout(resolve, 200));
    }
}

const aliceSession = await a.register(`e2e_alice_${suffix}`);
const alice = await a.startClient(aliceSession, {}, { crypto: true });
const bobSession = await b.register(`e2e_bob_${suffix}`);
const bob = await b.startClient(bobSession, {}, { crypto: true });

const { room_id: roomId } = await a.api("POST", "/createRoom", {
    token: aliceSession.access_token,
    body: {
        preset: "private_chat",
        invite: [bobSession.user_id],
        initial_state: [
            { type: "m.room.encryption", state_key: "", content: { algorithm: "m.megolm.v1.aes-sha2" } },
        ],
    },
});
await b.waitFor(() => bob.getRoom(roomId), WAIT_MS, "bob's client (B) to see the invite from A");
await bob.joinRoom(roomId);
await a.waitFor(
    () => alice.getRoom(roomId)?.getMember(bobSession.user_id)?.membership === "join",
    WAIT_MS,
    "alice's client (A) to see bob join",
);
await b.waitFor(() => bob.getRoom(roomId)?.hasEncryptionStateEvent(), WAIT_MS, "bob's client to see m.room.encryption");
b.check(true, "bob (B) joined alice's encrypted room on A");

// alice (A) -> bob (B).
await waitForDevice(a, alice, bobSession.user_id);
const secretA = `from A ${suffix}`;
const { event_id: idA } = await alice.sendTextMessage(roomId, secretA);
await b.waitFor(() => bob.getRoom(roomId)?.findEventById(idA), WAIT_MS, "alice's message to reach bob (B)");
const rawA = await b.api("GET", `/rooms/${encodeURIComponent(roomId)}/event/${encodeURIComponent(idA)}`, {
    token: bobSession.access_token,
});
b.check(
    rawA.type === "m.room.encrypted" && !JSON.stringify(rawA).includes(secretA),
    "B's server has only the ciphertext of alice's message",
);
await b.waitFor(() => clearBody(bob, roomId, idA) === secretA, WAIT_MS, "bob (B) to decrypt alice's message");
b.check(true, "bob (B) decrypts alice's encrypted message from A");

// bob (B) -> alice (A).
await waitForDevice(b, bob, aliceSession.user_id);
const secretB = `from B ${suffix}`;
const { event_id: idB } = await bob.sendTextMessage(roomId, secretB);
await a.waitFor(() => clearBody(alice, roomId, idB) === secretB, WAIT_MS, "alice (A) to decrypt bob's message");
a.check(true, "alice (A) decrypts bob's encrypted message from B");

bob.stopClient();
a.pass();
