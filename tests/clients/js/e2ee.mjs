// End-to-end encryption with matrix-js-sdk's Rust crypto: two users exchange encrypted
// messages in an encrypted room and decrypt each other's; a second device of the sender
// decrypts the history through server-side key backup.
//
// Usage: node e2ee.mjs http://127.0.0.1:PORT (MYELIN_JS_VERBOSE=1 logs requests)

import { randomBytes } from "node:crypto";
import { EventType } from "matrix-js-sdk";

import { harness } from "./harness.mjs";

const { api, register, login, check, fail, pass, waitFor, startClient } = harness("e2ee", {
    totalTimeoutMs: 180_000,
});
const WAIT_MS = 30_000;

// The decrypted body of an event in a client's room, once it has decrypted it.
function clearBody(client, roomId, eventId) {
    const event = client.getRoom(roomId)?.findEventById(eventId);
    if (!event || event.isBeingDecrypted() || event.isDecryptionFailure()) return undefined;
    return event.getType() === EventType.RoomMessage ? event.getContent().body : undefined;
}

async function main() {
    const suffix = randomBytes(4).toString("hex");
    const aliceSession = await register(`jsea${suffix}`);
    const bobSession = await register(`jseb${suffix}`);
    const alice = await startClient(aliceSession, {}, { crypto: true });
    const bob = await startClient(bobSession, {}, { crypto: true });

    const { room_id: roomId } = await api("POST", "/createRoom", {
        token: aliceSession.access_token,
        body: {
            preset: "private_chat",
            invite: [bobSession.user_id],
            initial_state: [
                { type: "m.room.encryption", state_key: "", content: { algorithm: "m.megolm.v1.aes-sha2" } },
            ],
        },
    });
    await waitFor(() => bob.getRoom(roomId), WAIT_MS, "Bob's client to see the invite");
    await bob.joinRoom(roomId);
    await waitFor(
        () => alice.getRoom(roomId)?.getMember(bobSession.user_id)?.membership === "join",
        WAIT_MS,
        "Alice's client to see Bob join",
    );
    check(alice.getRoom(roomId).hasEncryptionStateEvent(), "the room is encrypted");

    // Alice -> Bob.
    const { event_id: secretId } = await alice.sendTextMessage(roomId, "the secret is 42");
    const raw = await api("GET", `/rooms/${encodeURIComponent(roomId)}/event/${encodeURIComponent(secretId)}`, {
        token: bobSession.access_token,
    });
    check(
        raw.type === "m.room.encrypted" && !JSON.stringify(raw).includes("the secret"),
        "the server only has ciphertext",
    );
    await waitFor(() => clearBody(bob, roomId, secretId) === "the secret is 42", WAIT_MS, "Bob to decrypt Alice's message");
    check(true, "Bob decrypts Alice's message");

    // Bob -> Alice.
    const { event_id: replyId } = await bob.sendTextMessage(roomId, "got it");
    await waitFor(() => clearBody(alice, roomId, replyId) === "got it", WAIT_MS, "Alice to decrypt Bob's reply");
    check(true, "Alice decrypts Bob's reply");

    // Alice backs her room keys up to the server.
    const aliceCrypto = alice.getCrypto();
    await aliceCrypto.resetKeyBackup();
    let version = null;
    const backupDeadline = Date.now() + WAIT_MS;
    while (Date.now() < backupDeadline) {
        const info = await api("GET", "/room_keys/version", { token: aliceSession.access_token });
        if (info.count >= 2) {
            version = info.version;
            break;
        }
        await new Promise((resolve) => setTimeout(resolve, 250));
    }
    if (!version) fail("Alice's room keys never reached the key backup");
    check(true, `Alice's room keys are in backup version ${version}`);
    const backupKey = await aliceCrypto.getSessionBackupPrivateKey();
    check(backupKey !== null, "Alice's client holds the backup decryption key");

    // A second device of Alice's, restoring the backup, reads the history.
    const secondSession = await login(aliceSession.user_id);
    const second = await startClient(secondSession, {}, { crypto: true });
    await waitFor(() => second.getRoom(roomId)?.findEventById(secretId), WAIT_MS, "the second device to have the history");
    check(clearBody(second, roomId, secretId) === undefined, "the second device cannot read the history before restoring");
    await second.getCrypto().storeSessionBackupPrivateKey(backupKey, version);
    const restored = await second.getCrypto().restoreKeyBackup();
    check(restored.imported >= 2, `the second device restored ${restored.imported} keys from the backup`);
    await waitFor(
        () => clearBody(second, roomId, secretId) === "the secret is 42" && clearBody(second, roomId, replyId) === "got it",
        WAIT_MS,
        "the second device to decrypt the history",
    );
    check(true, "the second device decrypts the history through key backup");
    pass();
}

main().catch((err) => fail(err?.stack || String(err)));
