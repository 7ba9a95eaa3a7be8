// Olm across servers with matrix-js-sdk's Rust crypto: alice on server A finds bob's device on
// server B (/keys/query through A to B), claims one of its one-time keys (/keys/claim through
// A to B), starts an Olm session and sends bob an encrypted to-device message, which crosses
// federation as an m.direct_to_device EDU; bob's client on B decrypts it.
//
//   node olm.mjs http://A-client-api http://B-client-api

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

const alice = await a.startClient(await a.register(`olm_alice_${suffix}`), {}, { crypto: true });
const bobSession = await b.register(`olm_bob_${suffix}`);
const bob = await b.startClient(bobSession, {}, { crypto: true });
const received = [];
bob.on(ClientEvent.ToDeviceEvent, (event) => received.push(event));

// Bob's client uploads its device keys and one-time keys once its crypto has started.
let bobDevice;
const deadline = Date.now() + 60_000;
while (!bobDevice && Date.now() < deadline) {
    const devices = await alice.getCrypto().getUserDeviceInfo([bobSession.user_id], true);
    bobDevice = devices.get(bobSession.user_id)?.get(bobSession.device_id);
    if (!bobDevice) await new Promise((resolve) => setTimeout(resolve, 500));
}
a.check(bobDevice, `alice (A) sees bob's device ${bobSession.device_id} on B through /keys/query`);

const secret = `olm-${suffix}`;
const batch = await alice
    .getCrypto()
    .encryptToDeviceMessages(
        "org.myelin.olm_test",
        [{ userId: bobSession.user_id, deviceId: bobSession.device_id }],
        { secret },
    );
a.check(
    batch.eventType === "m.room.encrypted" && batch.batch.length === 1,
    "alice claimed a one-time key of bob's device across servers and Olm-encrypted a message",
);
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
