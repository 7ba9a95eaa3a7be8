// Olm across servers with matrix-js-sdk's Rust crypto: alice on server A finds bob's device on
// server B (/keys/query through A to B), claims one of its one-time keys (/keys/claim through
// A to B), starts an Olm session and sends bob an encrypted to-device message, which crosses
// federation as an m.direct_to_device EDU; bob's client on B decrypts it.
//
//   node olm.mjs http://A-client-api http://B-client-api

import { UserId } from "@matrix-org/matrix-sdk-crypto-wasm";
import { ClientEvent } from "matrix-js-sdk";
import { harness } from "../harness.mjs";

const [urlA, urlB] = process.argv.slice(2);
if (!urlA || !urlB) {
    console.error("usage: node olm.mjs http://A-client-api http://B-client-api");
    process.exit(2);
}
const a = harness("federation_olm", { baseUrl: urlA, totalTimeoutMs: 180_000 });
const b = harness("federation_olm", { baseUrl: urlB, totalTimeoutMs: 180_000 });
const suffix = Math.random().toString(36).slice(2, 10);

const aliceSession = await a.register(`olm_alice_${suffix}`);
const alice = await a.startClient(aliceSession, {}, { crypto: true });
const bobSession = await b.register(`olm_bob_${suffix}`);
const bob = await b.startClient(bobSession, {}, { crypto: true });
const received = [];
bob.on(ClientEvent.ToDeviceEvent, (event) => received.push(event));

// A crypto machine encrypts only for devices of users it tracks, and accepts Olm messages only
// from devices it knows; it starts tracking a user when they share an encrypted room. Rooms
// do not span servers yet, so each machine is told to track the other user directly (its own
// /keys/query then crosses federation). The clients upload their keys once their crypto has
// started, so this is retried for a while.
async function trackUntilKnown(client, session) {
    const crypto = client.getCrypto();
    await crypto.olmMachine.updateTrackedUsers([new UserId(session.user_id)]);
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline) {
        await crypto.outgoingRequestsManager.doProcessOutgoingRequests();
        const devices = await crypto.getUserDeviceInfo([session.user_id]);
        const device = devices.get(session.user_id)?.get(session.device_id);
        if (device) return device;
        await crypto.olmMachine.markAllTrackedUsersAsDirty();
        await new Promise((resolve) => setTimeout(resolve, 500));
    }
    return undefined;
}
const bobDevice = await trackUntilKnown(alice, bobSession);
a.check(bobDevice, `alice (A) sees bob's device ${bobSession.device_id} on B through /keys/query`);

b.check(
    await trackUntilKnown(bob, aliceSession),
    `bob (B) sees alice's device ${aliceSession.device_id} on A through /keys/query`,
);

const secret = `olm-${suffix}`;
const batch = await alice
    .getCrypto()
    .encryptToDeviceMessages(
        "org.myelin.olm_test",
        [{ userId: bobSession.user_id, deviceId: bobSession.device_id }],
        { secret },
    );
if (batch.eventType !== "m.room.encrypted" || batch.batch.length !== 1) {
    a.fail(`no Olm message for bob's device: ${JSON.stringify(batch).slice(0, 300)}`);
}
a.check(true, "alice claimed a one-time key of bob's device across servers and Olm-encrypted a message");
await alice.queueToDevice(batch);

await b.waitFor(
    () =>
        received.some(
            (event) =>
                event.getType() === "org.myelin.olm_test" &&
                event.getSender() === alice.getUserId() &&
                event.getContent().secret === secret,
        ),
    60_000,
    "bob to decrypt alice's Olm message",
);
b.check(true, "bob (B) decrypted alice's Olm-encrypted to-device message from A");
bob.stopClient();
a.pass();
