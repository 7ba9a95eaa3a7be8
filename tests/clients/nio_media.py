"""Media with a real client: matrix-nio user A uploads an image and sends it to a room as an
m.image; user B downloads it through the authenticated media endpoint, gets the same bytes,
and a thumbnail of it.

Usage: python nio_media.py http://127.0.0.1:PORT
"""

import asyncio
import io
import struct
import sys
import uuid
import zlib

from nio import (
    AsyncClient,
    DownloadResponse,
    RoomCreateResponse,
    RoomGetEventResponse,
    RoomSendResponse,
    ThumbnailResponse,
    UploadResponse,
)


def check(condition, message):
    if not condition:
        raise SystemExit(f"FAIL: {message}")
    print(f"ok - {message}")


def png(width: int, height: int) -> bytes:
    """A small RGB PNG (no imaging library needed)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(
        b"\x00" + bytes(v for x in range(width) for v in (x * 4 % 256, y * 4 % 256, 128)) for y in range(height)
    )
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


async def new_user(homeserver: str, name: str) -> AsyncClient:
    client = AsyncClient(homeserver, name)
    response = await client.register(name, "secret password", device_name=f"{name}-device")
    check(getattr(response, "access_token", None), f"register {name}")
    return client


async def main(homeserver: str) -> None:
    suffix = uuid.uuid4().hex[:6]
    alice = await new_user(homeserver, f"alicem{suffix}")
    bob = await new_user(homeserver, f"bobm{suffix}")
    image = png(120, 90)

    uploaded, _ = await alice.upload(
        io.BytesIO(image), content_type="image/png", filename="cat.png", filesize=len(image)
    )
    check(isinstance(uploaded, UploadResponse), f"alice uploads an image: {uploaded}")
    check(uploaded.content_uri.startswith("mxc://"), f"the upload is {uploaded.content_uri}")

    created = await alice.room_create(invite=[bob.user_id])
    check(isinstance(created, RoomCreateResponse), "alice creates a room and invites bob")
    await bob.join(created.room_id)
    content = {
        "msgtype": "m.image",
        "body": "cat.png",
        "url": uploaded.content_uri,
        "info": {"mimetype": "image/png", "w": 120, "h": 90, "size": len(image)},
    }
    sent = await alice.room_send(created.room_id, "m.room.message", content)
    check(isinstance(sent, RoomSendResponse), "alice sends the image")

    fetched = await bob.room_get_event(created.room_id, sent.event_id)
    check(isinstance(fetched, RoomGetEventResponse), "bob reads the message")
    url = fetched.event.source["content"]["url"]
    server_name, media_id = url[len("mxc://") :].split("/", 1)
    downloaded = await bob.download(url)
    check(isinstance(downloaded, DownloadResponse), f"bob downloads the image: {type(downloaded).__name__}")
    check(downloaded.body == image, "the downloaded bytes are the uploaded bytes")
    check(downloaded.content_type.startswith("image/png"), f"content type {downloaded.content_type}")

    thumbnail = await bob.thumbnail(server_name, media_id, 32, 32)
    check(isinstance(thumbnail, ThumbnailResponse), f"bob gets a thumbnail: {type(thumbnail).__name__}")
    check(thumbnail.body.startswith(b"\x89PNG"), "the thumbnail is a PNG")

    await alice.close()
    await bob.close()
    print("nio media: 1 passed, 0 failed")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
