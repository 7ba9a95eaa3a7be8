// Shared plumbing for the matrix-js-sdk scripts: plain API calls, registration, started SDK
// clients, checks that print "ok - ..." and fail the script with the SDK's failed requests.
//
// Set MYELIN_JS_VERBOSE=1 to log every request the SDK makes and the SDK's own debug log.

import { ClientEvent, SyncState, createClient } from "matrix-js-sdk";
import { logger } from "matrix-js-sdk/lib/logger.js";

const verbose = !!process.env.MYELIN_JS_VERBOSE;
logger.setLevel(verbose ? "debug" : "warn", false);
if (!verbose) {
    // The Rust crypto's tracing writes debug and info lines straight to the console.
    console.debug = () => {};
    console.info = () => {};
}

// `baseUrl` defaults to the script's first argument; scripts that drive two servers pass it.
export function harness(name, { totalTimeoutMs = 120_000, baseUrl: givenUrl } = {}) {
    const baseUrl = (givenUrl ?? process.argv[2] ?? "").replace(/\/+$/, "");
    if (!baseUrl) {
        console.error(`usage: node ${name}.mjs http://127.0.0.1:PORT`);
        process.exit(2);
    }
    const clients = [];
    const sdkErrors = [];

    function fail(message) {
        console.error(`FAIL: ${message}`);
        if (sdkErrors.length) console.error(`failed SDK requests:\n  ${sdkErrors.join("\n  ")}`);
        for (const client of clients) {
            try {
                client.stopClient();
            } catch {
                // ignore: we are failing anyway
            }
        }
        console.log(`js-sdk ${name}: 0 passed, 1 failed`);
        process.exit(1);
    }

    const hardTimeout = setTimeout(
        () => fail(`overall timeout of ${totalTimeoutMs / 1000} s reached`),
        totalTimeoutMs,
    );

    function check(condition, message) {
        if (!condition) fail(message);
        console.log(`ok - ${message}`);
    }

    function pass() {
        for (const client of clients) client.stopClient();
        clearTimeout(hardTimeout);
        console.log(`js-sdk ${name}: 1 passed, 0 failed`);
        // Exit explicitly: an aborted long-poll or keep-alive socket must not keep node alive.
        process.exit(0);
    }

    // Plain client-server API calls (setup, and users not driven by the SDK).
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

    const password = "correct horse battery staple";

    async function register(username) {
        const res = await api("POST", "/register", {
            body: {
                username,
                password,
                auth: { type: "m.login.dummy" },
                initial_device_display_name: "js-sdk test",
            },
        });
        check(res.user_id && res.access_token && res.device_id, `register ${username} -> ${res.user_id}`);
        return res;
    }

    // Another device of an existing user.
    async function login(userId) {
        const res = await api("POST", "/login", {
            body: { type: "m.login.password", identifier: { type: "m.id.user", user: userId }, password },
        });
        check(res.access_token && res.device_id, `log ${userId} in on a second device ${res.device_id}`);
        return res;
    }

    // The SDK's requests go through this fetch so failures can be pinned on one request.
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

    // Polls until `condition()` holds; fails the script after `ms`.
    async function waitFor(condition, ms, what) {
        const deadline = Date.now() + ms;
        while (!condition()) {
            if (Date.now() > deadline) fail(`timed out after ${ms} ms waiting for ${what}`);
            await new Promise((resolve) => setTimeout(resolve, 50));
        }
    }

    // A started SDK client for a registered or logged-in session, once its first sync is done;
    // with `crypto`, it runs the SDK's Rust crypto (in memory).
    async function startClient(session, options = {}, { crypto = false } = {}) {
        const client = createClient({
            baseUrl,
            accessToken: session.access_token,
            userId: session.user_id,
            deviceId: session.device_id,
            fetchFn: loggingFetch,
            timelineSupport: true,
        });
        clients.push(client);
        if (crypto) await client.initRustCrypto({ useIndexedDB: false });
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
        await client.startClient(options);
        try {
            const state = await withTimeout(ready, 30_000, "sync state PREPARED");
            check(true, `${session.user_id} (${session.device_id}) reached sync state ${state}`);
        } catch (err) {
            fail(err.message);
        }
        return client;
    }

    return { baseUrl, api, register, login, check, fail, pass, withTimeout, waitFor, startClient, sdkErrors };
}
