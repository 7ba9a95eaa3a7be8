"""A real client against a running Myelin: matrix-nio registers, logs in, reads whoami,
sets a display name, manages a device, logs out, and checks the old token is rejected.

Usage: python nio_smoke.py http://127.0.0.1:PORT
"""

import asyncio
import sys
import uuid

from nio import (
    AsyncClient,
    DevicesResponse,
    LoginResponse,
    LogoutResponse,
    ProfileGetDisplayNameResponse,
    ProfileSetDisplayNameResponse,
    RegisterResponse,
    WhoamiError,
    WhoamiResponse,
)


def check(condition, message):
    if not condition:
        raise SystemExit(f"FAIL: {message}")
    print(f"ok - {message.splitlines()[0][:100]}")


async def main(homeserver: str) -> None:
    user = f"nio{uuid.uuid4().hex[:8]}"
    password = "correct horse battery staple"

    client = AsyncClient(homeserver, user)
    registered = await client.register(user, password, device_name="nio-register")
    check(isinstance(registered, RegisterResponse), f"register {user}: {type(registered).__name__}")
    await client.close()

    # The server name is whatever the server runs with (it may carry a port): take it from the
    # registered ID, whose localpart cannot contain a colon.
    server_name = registered.user_id.split(":", 1)[1]
    client = AsyncClient(homeserver, f"@{user}:{server_name}")
    login = await client.login(password, device_name="nio-smoke")
    check(isinstance(login, LoginResponse), f"login: {type(login).__name__}")
    check(login.user_id == f"@{user}:{server_name}", "login returns the full user id")

    whoami = await client.whoami()
    check(isinstance(whoami, WhoamiResponse), f"whoami: {type(whoami).__name__}")
    check(whoami.user_id == login.user_id and whoami.device_id == login.device_id, "whoami names user and device")

    set_name = await client.set_displayname("Nio Smoke")
    check(isinstance(set_name, ProfileSetDisplayNameResponse), f"set display name: {type(set_name).__name__}")
    got_name = await client.get_displayname()
    check(isinstance(got_name, ProfileGetDisplayNameResponse), f"get display name: {type(got_name).__name__}")
    check(got_name.displayname == "Nio Smoke", "display name round-trips")

    devices = await client.devices()
    check(isinstance(devices, DevicesResponse), f"devices: {type(devices).__name__}")
    check(any(d.id == login.device_id for d in devices.devices), "the login device is listed")

    old_token = client.access_token
    logout = await client.logout()
    check(isinstance(logout, LogoutResponse), f"logout: {type(logout).__name__}")

    client.access_token = old_token
    after = await client.whoami()
    check(isinstance(after, WhoamiError), f"old token rejected after logout: {type(after).__name__}")
    check(after.status_code == "M_UNKNOWN_TOKEN", f"rejected with M_UNKNOWN_TOKEN, got {after.status_code}")
    await client.close()
    print("nio smoke: 1 passed, 0 failed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
