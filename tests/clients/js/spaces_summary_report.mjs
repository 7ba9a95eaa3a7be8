// Spaces, room previews and reports as Element drives them through matrix-js-sdk: a space with
// three child rooms (one public and suggested, one restricted to the space, one private) is
// browsed through the hierarchy, page by page; a member of the space sees the restricted room
// and joins it, an outsider sees neither it nor the private one; a room is previewed through
// the summary before joining, the private one is not found; a message is reported, and one
// the reporter cannot see is not; an OpenID token is requested and checked through the
// federation userinfo endpoint, as a widget's service does.
//
// Usage: node spaces_summary_report.mjs http://127.0.0.1:PORT (MYELIN_JS_VERBOSE=1 logs requests)

import { randomBytes } from "node:crypto";

import { harness } from "./harness.mjs";

const { baseUrl, api, register, check, fail, pass, waitFor, startClient } = harness("spaces_summary_report");
const WAIT_MS = 15_000;

// Every room of the space's hierarchy, two per page.
async function browse(client, spaceId, suggestedOnly = false) {
    const rooms = [];
    let from;
    do {
        const page = await client.getRoomHierarchy(spaceId, 2, undefined, suggestedOnly, from);
        if (page.rooms.length > 2) fail(`a page of ${page.rooms.length} rooms for limit 2`);
        rooms.push(...page.rooms);
        from = page.next_batch;
    } while (from);
    return rooms;
}

async function main() {
    const suffix = randomBytes(4).toString("hex");
    const aliceSession = await register(`jssa${suffix}`);
    const bobSession = await register(`jssb${suffix}`);
    const carolSession = await register(`jssc${suffix}`);
    const server = aliceSession.user_id.slice(aliceSession.user_id.indexOf(":") + 1);
    const token = aliceSession.access_token;

    const { room_id: spaceId } = await api("POST", "/createRoom", {
        token,
        body: { preset: "public_chat", name: "JS space", creation_content: { type: "m.space" } },
    });
    const { room_id: generalId } = await api("POST", "/createRoom", {
        token,
        body: { preset: "public_chat", name: "General", topic: "everyone" },
    });
    const { room_id: teamId } = await api("POST", "/createRoom", {
        token,
        body: {
            preset: "private_chat",
            name: "Team",
            initial_state: [
                {
                    type: "m.room.join_rules",
                    state_key: "",
                    content: { join_rule: "restricted", allow: [{ type: "m.room_membership", room_id: spaceId }] },
                },
            ],
        },
    });
    const { room_id: secretId } = await api("POST", "/createRoom", {
        token,
        body: { preset: "private_chat", name: "Secret plans" },
    });
    const children = [
        [generalId, { via: [server], order: "a", suggested: true }],
        [teamId, { via: [server], order: "b" }],
        [secretId, { via: [server], order: "c" }],
    ];
    for (const [child, content] of children) {
        await api("PUT", `/rooms/${encodeURIComponent(spaceId)}/state/m.space.child/${encodeURIComponent(child)}`, {
            token,
            body: content,
        });
    }

    // Alice, in every room, sees the whole space in order.
    const alice = await startClient(aliceSession);
    const all = await browse(alice, spaceId);
    check(
        JSON.stringify(all.map((r) => r.room_id)) === JSON.stringify([spaceId, generalId, teamId, secretId]),
        "Alice browses the space and its three children, depth first, in order",
    );
    check(all[0].children_state.length === 3 && all[0].room_type === "m.space", "the space lists its three children");
    const suggested = await browse(alice, spaceId, true);
    check(
        JSON.stringify(suggested.map((r) => r.room_id)) === JSON.stringify([spaceId, generalId]),
        "only the suggested child with suggested_only",
    );

    // Bob joins the space: he sees the room restricted to it (and joins it), not the private one.
    const bob = await startClient(bobSession);
    await bob.joinRoom(spaceId);
    const bobView = await browse(bob, spaceId);
    const bobIds = bobView.map((r) => r.room_id);
    check(
        JSON.stringify(bobIds) === JSON.stringify([spaceId, generalId, teamId]),
        "Bob, in the space, sees the public and the restricted room, not the private one",
    );
    const team = bobView.find((r) => r.room_id === teamId);
    check(team.join_rule === "restricted" && team.name === "Team", "the restricted room shows as restricted");
    await bob.joinRoom(teamId);
    await waitFor(() => bob.getRoom(teamId)?.getMyMembership() === "join", WAIT_MS, "Bob to be in the team room");
    check(true, "Bob joins the restricted room through the space");

    // Carol is in nothing: the public rooms only.
    const carol = await startClient(carolSession);
    const carolIds = (await browse(carol, spaceId)).map((r) => r.room_id);
    check(
        JSON.stringify(carolIds) === JSON.stringify([spaceId, generalId]),
        "Carol, outside the space, sees neither the restricted nor the private room",
    );

    // Carol previews the general room before joining it; the private one is not found.
    const summary = await carol.getRoomSummary(generalId, [server]);
    check(
        summary.room_id === generalId && summary.name === "General" && summary.topic === "everyone",
        "Carol previews the general room through the summary",
    );
    check(summary.num_joined_members === 1 && summary.join_rule === "public", "the summary counts members and shows the join rule");
    check(summary.membership === "leave", `Carol's membership in the summary is leave (${summary.membership})`);
    let hidden = null;
    try {
        await carol.getRoomSummary(secretId, [server]);
    } catch (err) {
        hidden = err;
    }
    check(hidden?.errcode === "M_NOT_FOUND", `the private room's summary is not found for Carol (${hidden?.errcode})`);

    // Bob reports Alice's message in the general room; Carol cannot report one in the private room.
    await bob.joinRoom(generalId);
    const { event_id: messageId } = await alice.sendTextMessage(generalId, "buy cheap watches");
    await waitFor(() => bob.getRoom(generalId)?.findEventById(messageId), WAIT_MS, "Bob to get the message");
    const reported = await bob.reportEvent(generalId, messageId, -100, "spam");
    check(reported && Object.keys(reported).length === 0, "Bob reports the message");
    const { event_id: secretMessage } = await alice.sendTextMessage(secretId, "the plan");
    let refused = null;
    try {
        await carol.reportEvent(secretId, secretMessage, -100, "curious");
    } catch (err) {
        refused = err;
    }
    check(refused?.errcode === "M_NOT_FOUND", `Carol cannot report a message she cannot see (${refused?.errcode})`);
    const roomReported = await bob.reportRoom(generalId, "spam room");
    check(roomReported && Object.keys(roomReported).length === 0, "Bob reports the room");

    // A widget or Element Call asks for an OpenID token, which the service it is given to
    // checks with the server's federation userinfo endpoint.
    const openId = await bob.getOpenIdToken();
    check(
        typeof openId.access_token === "string" && openId.token_type === "Bearer" && openId.expires_in > 0,
        `Bob gets an OpenID token (${JSON.stringify({ ...openId, access_token: "…" })})`,
    );
    const userinfo = await fetch(
        `${baseUrl}/_matrix/federation/v1/openid/userinfo?access_token=${encodeURIComponent(openId.access_token)}`,
    );
    const info = await userinfo.json();
    check(userinfo.status === 200 && info.sub === bobSession.user_id, `the token names Bob (${JSON.stringify(info)})`);

    pass();
}

main().catch((err) => fail(err?.stack ?? String(err)));
