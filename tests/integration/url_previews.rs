//! URL previews fetched from a page the test serves on loopback (allowed with
//! `MYELIN_OUTBOUND_ALLOW`): Open Graph tags read, redirects followed but checked, the size
//! limit kept, results cached; off by default.

use std::sync::{
    atomic::{AtomicUsize, Ordering},
    Arc,
};

use serde_json::json;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use crate::support::{client::enc, Client, ServerOptions, TestServer};

const PAGE: &str = r#"<!doctype html><html><head>
<title>Fallback title</title>
<meta property="og:title" content="Myelin &amp; friends">
<meta property="og:description" content="A homeserver">
<meta property="og:type" content="website">
<meta property="og:image" content="/logo.png">
</head><body>hello</body></html>"#;

/// A tiny web server on loopback; counts the requests for each path.
struct Site {
    base: String,
    hits: Arc<std::sync::Mutex<std::collections::HashMap<String, usize>>>,
    requests: Arc<AtomicUsize>,
}

impl Site {
    async fn start() -> Site {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let hits = Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
        let requests = Arc::new(AtomicUsize::new(0));
        let (hits2, requests2) = (hits.clone(), requests.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let hits = hits2.clone();
                requests2.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut request = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => request.extend_from_slice(&buf[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&request);
                    let path = line.split(' ').nth(1).unwrap_or("/").to_owned();
                    *hits.lock().unwrap().entry(path.clone()).or_default() += 1;
                    let (status, headers, body): (&str, String, Vec<u8>) = match path.as_str() {
                        "/page" => ("200 OK", html(), PAGE.as_bytes().to_vec()),
                        "/redirect" => ("302 Found", "Location: /page\r\n".into(), Vec::new()),
                        "/to-blocked" => (
                            "302 Found",
                            "Location: http://127.0.0.2/page\r\n".into(),
                            Vec::new(),
                        ),
                        "/loop" => ("302 Found", "Location: /loop\r\n".into(), Vec::new()),
                        "/big" => {
                            let mut body = b"<html><head><title>Big</title>".to_vec();
                            body.extend(std::iter::repeat_n(b' ', 1100 * 1024));
                            body.extend_from_slice(
                                b"<meta property=\"og:description\" content=\"too far\">",
                            );
                            ("200 OK", html(), body)
                        }
                        "/image" => (
                            "200 OK",
                            "Content-Type: application/octet-stream\r\n".into(),
                            b"\x89PNG".to_vec(),
                        ),
                        "/logo.png" => (
                            "200 OK",
                            "Content-Type: image/png\r\n".into(),
                            crate::media::png(40, 30),
                        ),
                        _ => ("404 Not Found", html(), b"<title>missing</title>".to_vec()),
                    };
                    let head = format!(
                        "HTTP/1.1 {status}\r\n{headers}Content-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(&body).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Site {
            base,
            hits,
            requests,
        }
    }

    fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

fn html() -> String {
    "Content-Type: text/html; charset=utf-8\r\n".into()
}

fn preview_path(url: &str) -> String {
    format!("/_matrix/client/v1/media/preview_url?url={}", enc(url))
}

async fn previewing_server() -> (TestServer, Client) {
    let options = ServerOptions::default()
        .env("MYELIN_URL_PREVIEWS", "on")
        .env("MYELIN_OUTBOUND_ALLOW", "127.0.0.1/32");
    let server = TestServer::start_with(options).await;
    let alice = server.register("alice").await;
    (server, alice)
}

#[tokio::test]
async fn a_page_is_previewed_from_its_open_graph_tags_and_cached() {
    let site = Site::start().await;
    let (_server, alice) = previewing_server().await;
    let url = format!("{}/page", site.base);
    let preview = alice.get(&preview_path(&url)).await.ok();
    let mxc = preview["og:image"]
        .as_str()
        .expect("og:image stored as media");
    assert!(mxc.starts_with("mxc://"), "{mxc}");
    let size = crate::media::png(40, 30).len();
    assert_eq!(
        preview,
        json!({
            "og:title": "Myelin & friends",
            "og:description": "A homeserver",
            "og:type": "website",
            "og:image": mxc,
            "og:image:type": "image/png",
            "og:image:width": 40,
            "og:image:height": 30,
            "matrix:image:size": size,
        })
    );
    // The image is served (and thumbnailed) like any upload.
    let media_path = mxc.trim_start_matches("mxc://");
    let download = alice
        .get(&format!(
            "/_matrix/client/v1/media/thumbnail/{media_path}?width=32&height=32"
        ))
        .await;
    assert_eq!(download.status, 200);
    // An image URL previews as the image itself.
    let direct = alice
        .get(&preview_path(&format!("{}/logo.png", site.base)))
        .await
        .ok();
    assert!(direct["og:image"].as_str().unwrap().starts_with("mxc://"));
    assert_eq!(direct["og:image:width"], 40);
    // The legacy path answers the same, from the cache: the page is fetched once.
    let legacy = alice
        .get(&format!("/_matrix/media/v3/preview_url?url={}", enc(&url)))
        .await
        .ok();
    assert_eq!(legacy, preview);
    assert_eq!(site.hits("/page"), 1);
    // A redirect on the same (allowed) host is followed.
    let redirected = alice
        .get(&preview_path(&format!("{}/redirect", site.base)))
        .await
        .ok();
    assert_eq!(redirected["og:title"], "Myelin & friends");
}

#[tokio::test]
async fn blocked_targets_big_pages_and_other_content_are_handled_safely() {
    let site = Site::start().await;
    let (_server, alice) = previewing_server().await;
    // A redirect to an address outside the allow-list is not followed.
    alice
        .get(&preview_path(&format!("{}/to-blocked", site.base)))
        .await
        .assert_error(502, "M_UNKNOWN");
    alice
        .get(&preview_path(&format!("{}/loop", site.base)))
        .await
        .assert_error(502, "M_UNKNOWN");
    assert!(site.hits("/loop") <= 6, "redirects are bounded");
    // Loopback addresses not on the allow-list are refused without a request.
    let before = site.requests.load(Ordering::SeqCst);
    let port = site.base.rsplit(':').next().unwrap();
    alice
        .get(&preview_path(&format!("http://127.0.0.2:{port}/page")))
        .await
        .assert_error(502, "M_UNKNOWN");
    alice
        .get(&preview_path(&format!("http://[::1]:{port}/page")))
        .await
        .assert_error(502, "M_UNKNOWN");
    assert_eq!(site.requests.load(Ordering::SeqCst), before);
    // Only the first MiB is read.
    let big = alice
        .get(&preview_path(&format!("{}/big", site.base)))
        .await
        .ok();
    assert_eq!(big, json!({ "og:title": "Big" }));
    // Neither HTML nor an image: nothing to preview. An error page: 502.
    let image = alice
        .get(&preview_path(&format!("{}/image", site.base)))
        .await
        .ok();
    assert_eq!(image, json!({}));
    alice
        .get(&preview_path(&format!("{}/missing", site.base)))
        .await
        .assert_error(502, "M_UNKNOWN");
    alice
        .get(&preview_path("ftp://example.org/x"))
        .await
        .assert_error(400, "M_INVALID_PARAM");
}

#[tokio::test]
async fn previews_are_off_by_default_and_fetch_nothing() {
    let site = Site::start().await;
    let server = TestServer::start_with(
        ServerOptions::default().env("MYELIN_OUTBOUND_ALLOW", "127.0.0.1/32"),
    )
    .await;
    let alice = server.register("alice").await;
    let preview = alice
        .get(&preview_path(&format!("{}/page", site.base)))
        .await
        .ok();
    assert_eq!(preview, json!({}));
    assert_eq!(site.requests.load(Ordering::SeqCst), 0);
}
