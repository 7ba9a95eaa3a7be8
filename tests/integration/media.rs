//! The media repository: uploads, authenticated downloads, dedup, thumbnails, placeholders.

use std::io::Cursor;

use image::{DynamicImage, ImageFormat, RgbImage};
use reqwest::{header, StatusCode};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::support::{client::enc, server_name, Client, ServerOptions, TestServer};

/// Raw HTTP, for bodies that are not JSON.
pub(crate) async fn send(
    client: &Client,
    method: reqwest::Method,
    path: &str,
    body: Vec<u8>,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let mut request = reqwest::Client::new()
        .request(method, format!("{}{}", client.base, path))
        .body(body);
    if let Some(token) = &client.token {
        request = request.bearer_auth(token);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("request failed")
}

pub(crate) async fn upload(
    client: &Client,
    bytes: Vec<u8>,
    content_type: &str,
    name: &str,
) -> Value {
    let response = send(
        client,
        reqwest::Method::POST,
        &format!("/_matrix/media/v3/upload?filename={}", enc(name)),
        bytes,
        &[("Content-Type", content_type)],
    )
    .await;
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

fn media_path(content_uri: &str) -> String {
    content_uri
        .strip_prefix("mxc://")
        .expect("an mxc URI")
        .to_owned()
}

async fn download(client: &Client, content_uri: &str) -> reqwest::Response {
    send(
        client,
        reqwest::Method::GET,
        &format!(
            "/_matrix/client/v1/media/download/{}",
            media_path(content_uri)
        ),
        Vec::new(),
        &[],
    )
    .await
}

/// A photo-like JPEG: smooth gradients with some texture.
fn photo(width: u32, height: u32) -> Vec<u8> {
    let image = RgbImage::from_fn(width, height, |x, y| {
        let noise = ((x * 7919 + y * 104_729) % 37) as u8;
        image::Rgb([
            (x * 255 / width) as u8 ^ noise,
            (y * 255 / height) as u8,
            ((x + y) % 256) as u8,
        ])
    });
    let mut bytes = Vec::new();
    DynamicImage::ImageRgb8(image)
        .write_to(&mut Cursor::new(&mut bytes), ImageFormat::Jpeg)
        .unwrap();
    bytes
}

pub(crate) fn png(width: u32, height: u32) -> Vec<u8> {
    let image = RgbImage::from_fn(width, height, |x, y| image::Rgb([x as u8, y as u8, 128]));
    let mut bytes = Vec::new();
    DynamicImage::ImageRgb8(image)
        .write_to(&mut Cursor::new(&mut bytes), ImageFormat::Png)
        .unwrap();
    bytes
}

fn files_under(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| {
                    let path = e.path();
                    if path.is_dir() {
                        if path.ends_with("tmp") {
                            0
                        } else {
                            files_under(&path)
                        }
                    } else {
                        1
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

#[tokio::test]
async fn uploads_come_back_identical_with_safe_headers_and_are_stored_once() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let text = b"hello, media".to_vec();
    let picture = png(64, 48);
    let jpeg = photo(200, 150);
    let html = b"<script>alert(1)</script>".to_vec();

    for (bytes, content_type, name, inline) in [
        (text.clone(), "text/plain", "note.txt", true),
        (picture.clone(), "image/png", "pic.png", true),
        (jpeg.clone(), "image/jpeg", "photo.jpg", true),
        (html.clone(), "text/html", "page.html", false),
    ] {
        let uploaded = upload(&alice, bytes.clone(), content_type, name).await;
        let uri = uploaded["content_uri"].as_str().unwrap();
        assert!(uri.starts_with(&format!("mxc://{}/", server_name())));
        let response = download(&bob, uri).await;
        assert_eq!(response.status(), StatusCode::OK);
        let headers = response.headers().clone();
        // Text gets `; charset=utf-8` appended, as Synapse does.
        assert!(headers[header::CONTENT_TYPE]
            .to_str()
            .unwrap()
            .starts_with(content_type));
        let disposition = headers[header::CONTENT_DISPOSITION].to_str().unwrap();
        assert!(
            disposition.starts_with(if inline { "inline" } else { "attachment" }),
            "{disposition}"
        );
        assert!(disposition.contains(name), "{disposition}");
        assert!(headers[header::CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .starts_with("sandbox"));
        assert_eq!(headers["cross-origin-resource-policy"], "cross-origin");
        assert_eq!(
            response.bytes().await.unwrap().to_vec(),
            bytes,
            "{content_type}"
        );
    }

    // Images get a BlurHash placeholder at once.
    let with_hash = upload(&alice, picture.clone(), "image/png", "again.png").await;
    let hash = with_hash["xyz.amorgan.blurhash"]
        .as_str()
        .expect("a blurhash");
    assert!(hash.len() >= 6);
    // The same bytes uploaded twice (three times, here) are one file on disk.
    let media_dir = server.data_dir().join("media");
    let before = files_under(&media_dir);
    upload(&bob, picture.clone(), "image/png", "copy.png").await;
    assert_eq!(files_under(&media_dir), before);

    // A named download and a range request.
    let uri = upload(&alice, text.clone(), "text/plain", "note.txt").await["content_uri"]
        .as_str()
        .unwrap()
        .to_owned();
    let named = send(
        &bob,
        reqwest::Method::GET,
        &format!(
            "/_matrix/client/v1/media/download/{}/renamed.txt",
            media_path(&uri)
        ),
        Vec::new(),
        &[],
    )
    .await;
    assert!(named.headers()[header::CONTENT_DISPOSITION]
        .to_str()
        .unwrap()
        .contains("renamed.txt"));
    let partial = send(
        &bob,
        reqwest::Method::GET,
        &format!("/_matrix/client/v1/media/download/{}", media_path(&uri)),
        Vec::new(),
        &[("Range", "bytes=0-4")],
    )
    .await;
    assert_eq!(partial.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(partial.bytes().await.unwrap().as_ref(), b"hello");

    // Downloads need a token; unknown media is 404; the legacy endpoint serves nothing new.
    let anonymous = Client::new(&server.base_url);
    assert_eq!(
        download(&anonymous, &uri).await.status(),
        StatusCode::UNAUTHORIZED
    );
    let missing = download(&bob, &format!("mxc://{}/nothing", server_name())).await;
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let body: Value = missing.json().await.unwrap();
    assert_eq!(body["errcode"], "M_NOT_FOUND");
    let legacy = send(
        &anonymous,
        reqwest::Method::GET,
        &format!("/_matrix/media/v3/download/{}", media_path(&uri)),
        Vec::new(),
        &[],
    )
    .await;
    assert_eq!(legacy.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_fifty_megabyte_file_is_streamed_through() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let big: Vec<u8> = (0..50 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let expected = Sha256::digest(&big);
    let rss_before = server.peak_rss_kib();
    let uploaded = upload(&alice, big, "application/octet-stream", "big.bin").await;
    let response = download(&alice, uploaded["content_uri"].as_str().unwrap()).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.headers()[header::CONTENT_DISPOSITION]
            .to_str()
            .unwrap()
            .split(';')
            .next(),
        Some("attachment")
    );
    let mut hasher = Sha256::new();
    let mut size = 0;
    let mut stream = response;
    while let Some(chunk) = stream.chunk().await.unwrap() {
        size += chunk.len();
        hasher.update(&chunk);
    }
    assert_eq!(size, 50 * 1024 * 1024);
    assert_eq!(hasher.finalize(), expected);
    let growth_mib = (server.peak_rss_kib().saturating_sub(rss_before)) / 1024;
    eprintln!(
        "server peak RSS {} MiB; grew by {growth_mib} MiB during a 50 MiB upload and download",
        server.peak_rss_kib() / 1024
    );
    assert!(
        growth_mib < 40,
        "the file was buffered: peak RSS grew by {growth_mib} MiB"
    );
}

#[tokio::test]
async fn thumbnails_have_the_requested_size_class_and_bad_images_fail_cleanly() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let uri = upload(&alice, photo(1600, 1200), "image/jpeg", "photo.jpg").await["content_uri"]
        .as_str()
        .unwrap()
        .to_owned();
    let thumb = |uri: &str, query: &str| {
        let path = format!(
            "/_matrix/client/v1/media/thumbnail/{}?{query}",
            media_path(uri)
        );
        let alice = alice.clone();
        async move { send(&alice, reqwest::Method::GET, &path, Vec::new(), &[]).await }
    };
    for (query, size) in [
        ("width=300&height=200&method=scale", (320, 240)),
        ("width=96&height=96&method=crop", (96, 96)),
        ("width=30&height=30&method=crop", (32, 32)),
        ("width=5000&height=5000&method=scale", (800, 600)),
    ] {
        let response = thumb(&uri, query).await;
        assert_eq!(response.status(), StatusCode::OK, "{query}");
        assert_eq!(response.headers()[header::CONTENT_TYPE], "image/jpeg");
        // Required since v1.12: inline, with a file name.
        assert_eq!(
            response.headers()[header::CONTENT_DISPOSITION],
            "inline; filename=\"thumbnail.jpeg\""
        );
        let bytes = response.bytes().await.unwrap();
        let image = image::load_from_memory(&bytes).unwrap();
        assert_eq!((image.width(), image.height()), size, "{query}");
    }
    // Never upscaled: a small image's scale thumbnail keeps its size.
    let small = upload(&alice, png(40, 30), "image/png", "small.png").await["content_uri"]
        .as_str()
        .unwrap()
        .to_owned();
    let response = thumb(&small, "width=640&height=480").await;
    let image = image::load_from_memory(&response.bytes().await.unwrap()).unwrap();
    assert_eq!((image.width(), image.height()), (40, 30));

    // A truncated PNG and a decompression bomb upload fine but cannot be thumbnailed.
    let mut truncated = png(300, 300);
    truncated.truncate(truncated.len() / 3);
    let truncated = upload(&alice, truncated, "image/png", "broken.png").await;
    assert!(truncated.get("xyz.amorgan.blurhash").is_none());
    let bomb = upload(&alice, bomb_png(60_000, 60_000), "image/png", "bomb.png").await;
    for uploaded in [truncated, bomb] {
        let response = thumb(
            uploaded["content_uri"].as_str().unwrap(),
            "width=96&height=96",
        )
        .await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST);
        let body: Value = response.json().await.unwrap();
        assert_eq!(body["errcode"], "M_UNKNOWN");
    }
    let text = upload(&alice, b"plain".to_vec(), "text/plain", "a.txt").await;
    let response = thumb(text["content_uri"].as_str().unwrap(), "width=96&height=96").await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    // Still serving.
    assert_eq!(
        thumb(&uri, "width=32&height=32&method=crop").await.status(),
        StatusCode::OK
    );
}

/// A PNG whose header claims huge dimensions over a tiny compressed body.
fn bomb_png(width: u32, height: u32) -> Vec<u8> {
    // A zlib stream of a few zero bytes: decompresses to far less than the header promises.
    png_with_idat(
        width,
        height,
        &[0x78, 0x9c, 0x63, 0x60, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01],
    )
}

/// A complete, valid black RGB PNG of any size that stays small on disk: its zlib stream is
/// written by hand as one literal zero and then "repeat the last 258 bytes" matches (13 bits
/// each), so 11000x11000 (363 MB of pixels) takes about 2 MB.
fn black_png(width: u32, height: u32) -> Vec<u8> {
    struct Bits {
        out: Vec<u8>,
        acc: u64,
        len: u32,
    }
    impl Bits {
        /// `n` bits of `value`, least significant first (headers, extra bits).
        fn put(&mut self, value: u64, n: u32) {
            self.acc |= value << self.len;
            self.len += n;
            while self.len >= 8 {
                self.out.push(self.acc as u8);
                self.acc >>= 8;
                self.len -= 8;
            }
        }
        /// A Huffman code of `n` bits, most significant first.
        fn code(&mut self, code: u64, n: u32) {
            let reversed = (0..n).fold(0, |r, i| r | ((code >> i) & 1) << (n - 1 - i));
            self.put(reversed, n);
        }
    }
    let total = (1 + 3 * u64::from(width)) * u64::from(height);
    let mut bits = Bits {
        out: vec![0x78, 0x01],
        acc: 0,
        len: 0,
    };
    bits.put(1, 1); // final block
    bits.put(1, 2); // fixed Huffman codes
    bits.code(0x30, 8); // literal 0
    let (matches, rest) = ((total - 1) / 258, (total - 1) % 258);
    for _ in 0..matches {
        bits.code(0xc5, 8); // length 258
        bits.code(0, 5); // distance 1
    }
    for _ in 0..rest {
        bits.code(0x30, 8);
    }
    bits.code(0, 7); // end of block
    bits.put(0, 7); // pad to a byte
    let mut idat = bits.out;
    // Adler-32 of all zeros: a = 1, b = length mod 65521.
    let adler = ((total % 65521) << 16 | 1) as u32;
    idat.extend_from_slice(&adler.to_be_bytes());
    png_with_idat(width, height, &idat)
}

/// An 8-bit RGB PNG with this header and IDAT.
fn png_with_idat(width: u32, height: u32, idat: &[u8]) -> Vec<u8> {
    fn chunk(kind: &[u8], data: &[u8]) -> Vec<u8> {
        let mut out = (data.len() as u32).to_be_bytes().to_vec();
        out.extend_from_slice(kind);
        out.extend_from_slice(data);
        let mut crc_input = kind.to_vec();
        crc_input.extend_from_slice(data);
        out.extend_from_slice(&crc32(&crc_input).to_be_bytes());
        out
    }
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = 0xffff_ffffu32;
        for &byte in bytes {
            crc ^= byte as u32;
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xedb8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
    let mut header = width.to_be_bytes().to_vec();
    header.extend_from_slice(&height.to_be_bytes());
    header.extend_from_slice(&[8, 2, 0, 0, 0]);
    let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
    png.extend(chunk(b"IHDR", &header));
    png.extend(chunk(b"IDAT", idat));
    png.extend(chunk(b"IEND", &[]));
    png
}

async fn thumbnail_of(client: &Client, content_uri: &str, query: &str) -> reqwest::Response {
    let path = format!(
        "/_matrix/client/v1/media/thumbnail/{}?{query}",
        media_path(content_uri)
    );
    send(client, reqwest::Method::GET, &path, Vec::new(), &[]).await
}

#[test]
fn the_black_png_helper_makes_a_valid_image() {
    let image = image::load_from_memory(&black_png(300, 200)).unwrap();
    assert_eq!((image.width(), image.height()), (300, 200));
    assert!(image.to_rgb8().pixels().all(|p| p.0 == [0, 0, 0]));
}

#[tokio::test]
async fn images_over_the_pixel_limit_are_never_decoded() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    // 11000 x 11000 is under the old per-side limit; 121 Mpx decode to 363 MB.
    let huge = black_png(11_000, 11_000);
    assert!(huge.len() < 4 << 20, "{} bytes", huge.len());
    let before = server.peak_rss_kib();
    let uploads =
        ["b0.png", "b1.png", "b2.png"].map(|name| upload(&alice, huge.clone(), "image/png", name));
    let uploaded = futures_util::future::join_all(uploads).await;
    for one in &uploaded {
        assert!(one.get("xyz.amorgan.blurhash").is_none(), "{one}");
    }
    let uri = uploaded[0]["content_uri"].as_str().unwrap();
    let response = thumbnail_of(&alice, uri, "width=96&height=96").await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["errcode"], "M_UNKNOWN");
    let grown_mib = (server.peak_rss_kib() - before) / 1024;
    assert!(grown_mib < 150, "decoded anyway: +{grown_mib} MiB");
    // The original is still served as uploaded.
    assert_eq!(download(&alice, uri).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn the_pixel_limit_is_configurable_and_thumbnails_are_made_once() {
    let server =
        TestServer::start_with(ServerOptions::default().env("MYELIN_MAX_IMAGE_PIXELS", "2000"))
            .await;
    let alice = server.register("alice").await;
    let small = upload(&alice, png(40, 30), "image/png", "small.png").await;
    assert!(small.get("xyz.amorgan.blurhash").is_some(), "{small}");
    let big = upload(&alice, png(60, 40), "image/png", "big.png").await;
    assert!(big.get("xyz.amorgan.blurhash").is_none(), "{big}");
    let response = thumbnail_of(
        &alice,
        big["content_uri"].as_str().unwrap(),
        "width=32&height=32",
    )
    .await;
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    // Concurrent requests for one thumbnail all get the same one.
    let uri = small["content_uri"].as_str().unwrap();
    let requests = (0..6).map(|_| thumbnail_of(&alice, uri, "width=32&height=32&method=crop"));
    let mut bodies = Vec::new();
    for response in futures_util::future::join_all(requests).await {
        assert_eq!(response.status(), StatusCode::OK);
        bodies.push(response.bytes().await.unwrap());
    }
    assert!(bodies.windows(2).all(|w| w[0] == w[1]));
    assert_eq!(
        server
            .count("SELECT COUNT(*) AS n FROM media_thumbnails")
            .await,
        1
    );
}

#[tokio::test]
async fn asynchronous_uploads_belong_to_their_creator_and_happen_once() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let bob = server.register("bob").await;
    let created = alice.post("/_matrix/media/v1/create", json!({})).await.ok();
    let uri = created["content_uri"].as_str().unwrap().to_owned();
    assert!(created["unused_expires_at"].as_i64().unwrap() > 0);
    let pending = download(&bob, &uri).await;
    assert_eq!(pending.status(), StatusCode::GATEWAY_TIMEOUT);
    let body: Value = pending.json().await.unwrap();
    assert_eq!(body["errcode"], "M_NOT_YET_UPLOADED");

    let put = |client: &Client, bytes: &'static [u8]| {
        let path = format!("/_matrix/media/v3/upload/{}", media_path(&uri));
        let client = client.clone();
        async move {
            send(
                &client,
                reqwest::Method::PUT,
                &path,
                bytes.to_vec(),
                &[("Content-Type", "text/plain")],
            )
            .await
        }
    };
    assert_eq!(put(&bob, b"hijack").await.status(), StatusCode::FORBIDDEN);
    assert_eq!(
        put(&alice, b"the real thing").await.status(),
        StatusCode::OK
    );
    let again = put(&alice, b"overwrite").await;
    assert_eq!(again.status(), StatusCode::CONFLICT);
    let body: Value = again.json().await.unwrap();
    assert_eq!(body["errcode"], "M_CANNOT_OVERWRITE_MEDIA");
    let response = download(&bob, &uri).await;
    assert_eq!(response.bytes().await.unwrap().as_ref(), b"the real thing");
}

#[tokio::test]
async fn the_size_limit_and_the_legacy_freeze_are_configurable() {
    let server = TestServer::start_with(
        ServerOptions::default()
            .env("MYELIN_MAX_UPLOAD_SIZE", "1000")
            .env("MYELIN_LEGACY_MEDIA_UNTIL", "99999999999999"),
    )
    .await;
    let alice = server.register("alice").await;
    let config = alice.get("/_matrix/client/v1/media/config").await.ok();
    assert_eq!(config["m.upload.size"], 1000);
    let too_big = send(
        &alice,
        reqwest::Method::POST,
        "/_matrix/media/v3/upload",
        vec![0u8; 2000],
        &[("Content-Type", "application/octet-stream")],
    )
    .await;
    assert_eq!(too_big.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let body: Value = too_big.json().await.unwrap();
    assert_eq!(body["errcode"], "M_TOO_LARGE");
    // Media from before the freeze stays on the legacy endpoint, without a token.
    let uri = upload(&alice, b"old style".to_vec(), "text/plain", "old.txt").await["content_uri"]
        .as_str()
        .unwrap()
        .to_owned();
    let legacy = send(
        &Client::new(&server.base_url),
        reqwest::Method::GET,
        &format!("/_matrix/media/v3/download/{}", media_path(&uri)),
        Vec::new(),
        &[],
    )
    .await;
    assert_eq!(legacy.status(), StatusCode::OK);
    assert_eq!(legacy.bytes().await.unwrap().as_ref(), b"old style");
}

/// `preview_url` (v1.11): with previews off (the default) the server fetches nothing, so a
/// preview is the empty OpenGraph object; it still needs a token and an http(s) URL.
#[tokio::test]
async fn url_previews_are_empty_and_need_a_token_and_a_web_url() {
    let server = TestServer::start().await;
    let alice = server.register("alice").await;
    let path = |url: &str| format!("/_matrix/client/v1/media/preview_url?url={}", enc(url));
    let preview = alice.get(&path("https://matrix.org/blog?x=1")).await.ok();
    assert_eq!(preview, json!({}));
    let at_time = format!("{}&ts=1510610716656", path("http://example.org"));
    assert_eq!(alice.get(&at_time).await.ok(), json!({}));
    for bad in [
        "not a url",
        "file:///etc/passwd",
        "ftp://example.org/x",
        "/relative",
    ] {
        alice
            .get(&path(bad))
            .await
            .assert_error(400, "M_INVALID_PARAM");
    }
    server
        .client()
        .get(&path("https://matrix.org"))
        .await
        .assert_error(401, "M_MISSING_TOKEN");
}
