//! Federation test support: a test CA made at test time, pairs of `myelin` processes that
//! federate over TLS on loopback, a fake homeserver that signs requests with its own key and
//! records the transactions sent to it, and (from `remote_members`) remote members written
//! into a room without a handshake.
//! Each federation test file uses a different part of it.
#![allow(dead_code)]

use std::{
    net::TcpListener,
    path::PathBuf,
    process::Command,
    sync::{Arc, Mutex, OnceLock},
};

use rand::Rng;
use ruma::{
    api::federation::authentication::{XMatrix, XMatrixSigningInput},
    serde::Base64,
    signatures::Ed25519KeyPair,
    CanonicalJsonObject, CanonicalJsonValue, OwnedServerName,
};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub use super::remote_members::{join_remote, put_remote_member};
use super::{client::enc, Client, ServerOptions, TestServer};

/// A CA and a leaf certificate for `localhost`, `127.0.0.1` and `::1`, made once per test
/// binary with openssl. Every server presents the leaf and trusts the CA.
pub struct TestCa {
    dir: PathBuf,
}

impl TestCa {
    /// The CA certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }
    /// The leaf certificate (PEM).
    pub fn cert(&self) -> PathBuf {
        self.dir.join("cert.pem")
    }
    /// The leaf's private key (PEM).
    pub fn key(&self) -> PathBuf {
        self.dir.join("key.pem")
    }
}

/// The test CA (made on first use).
pub fn test_ca() -> &'static TestCa {
    static CA: OnceLock<TestCa> = OnceLock::new();
    CA.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("myelin-test-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let openssl = |args: &[&str]| {
            let output = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("openssl runs");
            assert!(
                output.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-sha256",
            "-days",
            "30",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-subj",
            "/CN=myelin test CA",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-sha256",
            "-keyout",
            "key.pem",
            "-out",
            "leaf.csr",
            "-subj",
            "/CN=localhost",
        ]);
        // rustls refuses a CA certificate as an end entity: the leaf is CA:FALSE.
        std::fs::write(
            dir.join("leaf.ext"),
            "basicConstraints=critical,CA:FALSE\n\
             keyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=serverAuth\n\
             subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "leaf.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "30",
            "-sha256",
            "-extfile",
            "leaf.ext",
            "-out",
            "cert.pem",
        ]);
        TestCa { dir }
    })
}

/// A free loopback port (the server name carries it, so it is chosen before the server starts).
///
/// It is taken from below the kernel's ephemeral range: a server killed and relaunched on its
/// port must find it still free, and any port in that range can be handed meanwhile to another
/// test's listener on port 0 or to an outgoing connection (CI once saw a relaunch fail with
/// "address in use" that way). Each call moves on from a random start, so tests of one process
/// never get the same port, and two processes seldom try the same one.
pub fn free_port() -> u16 {
    static NEXT: OnceLock<std::sync::atomic::AtomicU32> = OnceLock::new();
    let ephemeral_start = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (low, high) = (
        ephemeral_start.saturating_sub(12_000).max(1024),
        ephemeral_start,
    );
    let next = NEXT.get_or_init(|| rand::rng().random_range(low..high).into());
    for _ in low..high {
        let offset = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let port = u16::try_from(low + offset % (high - low)).expect("a port below 65536");
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {low}..{high}");
}

/// Settings for a server named `localhost:{port}` whose TLS federation listener is on that
/// port, trusting the test CA, allowed to reach loopback.
pub fn federated_options(port: u16) -> ServerOptions {
    let ca = test_ca();
    ServerOptions::default()
        .env("MYELIN_SERVER_NAME", &format!("localhost:{port}"))
        .env("MYELIN_FEDERATION_LISTEN", &format!("127.0.0.1:{port}"))
        .env("MYELIN_TLS_CERT", ca.cert().to_str().unwrap())
        .env("MYELIN_TLS_KEY", ca.key().to_str().unwrap())
        .env("MYELIN_FEDERATION_CA_FILE", ca.ca().to_str().unwrap())
        .env("MYELIN_OUTBOUND_ALLOW", "127.0.0.1/32, ::1/128")
}

/// Starts a server that federates (see [`federated_options`]).
pub async fn federated_server() -> TestServer {
    TestServer::start_with(federated_options(free_port())).await
}

/// Two federating servers with different names.
pub async fn pair() -> (TestServer, TestServer) {
    tokio::join!(federated_server(), federated_server())
}

/// `options` with retries to an unreachable server after 100 to 400 ms (not seconds): tests
/// that stop a server see the other catch up at once when it is back.
pub fn quick_retries(options: ServerOptions) -> ServerOptions {
    options
        .env("MYELIN_FEDERATION_RETRY_MIN_MS", "100")
        .env("MYELIN_FEDERATION_RETRY_MAX_MS", "400")
}

/// Two federating servers (see [`pair`]) that retry quickly (see [`quick_retries`]).
pub async fn quick_pair() -> (TestServer, TestServer) {
    tokio::join!(
        TestServer::start_with(quick_retries(federated_options(free_port()))),
        TestServer::start_with(quick_retries(federated_options(free_port()))),
    )
}

/// `client` (a user of another server) joins `room` through `resident`'s server.
pub async fn join_over_federation(client: &Client, resident: &TestServer, room: &str) {
    let path = format!(
        "/_matrix/client/v3/join/{}?via={}",
        enc(room),
        enc(resident.server_name())
    );
    let joined = client.post(&path, json!({})).await.ok();
    assert_eq!(joined["room_id"], room, "{joined}");
}

/// A room's current state as `client` reads it: `(type, state_key, event ID)`.
pub async fn state_ids(client: &Client, room: &str) -> Vec<(String, String, String)> {
    let state = client
        .get(&format!("/_matrix/client/v3/rooms/{}/state", enc(room)))
        .await
        .ok();
    state
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap().to_owned(),
                e["state_key"].as_str().unwrap().to_owned(),
                e["event_id"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// An HTTPS client trusting the test CA (for requests straight to a federation listener).
pub fn https_client() -> reqwest::Client {
    let pem = std::fs::read(test_ca().ca()).unwrap();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).unwrap())
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .unwrap()
}

impl TestServer {
    /// The federation listener's base URL, `https://localhost:{port}`.
    pub fn federation_url(&self) -> String {
        format!("https://{}", self.server_name())
    }
}

/// A homeserver of the test's own: a name `localhost:{port}`, an ed25519 key it publishes at
/// `/_matrix/key/v2/server` over TLS on that port, requests it signs with X-Matrix, and a
/// record of the transactions (`PUT /send/{txnId}`) other servers send it.
pub struct FakeServer {
    name: OwnedServerName,
    key_pair: Arc<Ed25519KeyPair>,
    inbox: Arc<SendInbox>,
    task: tokio::task::JoinHandle<()>,
}

/// How a [`FakeServer`] answers `PUT /_matrix/federation/v1/send/{txnId}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SendAnswer {
    /// 200, every PDU accepted.
    #[default]
    Accept,
    /// 200 with an `error` for every PDU (the transaction itself is accepted).
    RefusePdus,
    /// This status with an `M_UNKNOWN` error (a server that is down behind a proxy).
    Status(u16),
    /// No answer: the connection is closed once the request is read (unreachable).
    HangUp,
}

/// One `PUT /send` a [`FakeServer`] received.
#[derive(Debug, Clone)]
pub struct SendAttempt {
    /// The transaction ID of the path.
    pub txn_id: String,
    /// The body.
    pub body: Value,
    /// How it was answered.
    pub answer: SendAnswer,
}

impl SendAttempt {
    /// Whether the sender got a 200.
    pub fn delivered(&self) -> bool {
        matches!(self.answer, SendAnswer::Accept | SendAnswer::RefusePdus)
    }
}

/// The transactions a [`FakeServer`] received and how it answers the next ones.
#[derive(Default)]
struct SendInbox {
    attempts: Mutex<Vec<SendAttempt>>,
    answer: Mutex<SendAnswer>,
    /// Documents added while serving ([`FakeServer::serve`]), by decoded path.
    documents: Mutex<Vec<(String, Vec<u8>)>>,
}

impl Drop for FakeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl FakeServer {
    /// Starts serving the key document, as `localhost:{port}`.
    pub async fn start() -> FakeServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        Self::serving(listener, &format!("localhost:{port}"))
    }

    /// Starts serving the key document on `listener` under the name `name` (a name without
    /// the port needs delegation, see [`StaticHttps`], to be found).
    pub fn serving(listener: tokio::net::TcpListener, name: &str) -> FakeServer {
        Self::serving_with(listener, name, Vec::new())
    }

    /// Starts serving the key document and the documents `documents(name)` makes (`GET path`
    /// answers its JSON), as `localhost:{port}`.
    pub async fn start_with(documents: impl FnOnce(&str) -> Vec<(String, Value)>) -> FakeServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let name = format!("localhost:{port}");
        let documents = documents(&name);
        Self::serving_with(listener, &name, documents)
    }

    fn serving_with(
        listener: tokio::net::TcpListener,
        name: &str,
        documents: Vec<(String, Value)>,
    ) -> FakeServer {
        let name = OwnedServerName::try_from(name).unwrap();
        let der = Ed25519KeyPair::generate();
        let key_pair = Arc::new(Ed25519KeyPair::from_der(&der, "fake1".into()).unwrap());
        let document = key_document(&name, &key_pair);
        let mut documents: Vec<(String, Vec<u8>)> = documents
            .into_iter()
            .map(|(path, json)| (path, serde_json::to_vec(&json).unwrap()))
            .collect();
        documents.push(("/_matrix/key/v2/server".into(), document));
        let inbox = Arc::new(SendInbox::default());
        let task = serve_documents(listener, documents, Some(inbox.clone()));
        FakeServer {
            name,
            key_pair,
            inbox,
            task,
        }
    }

    /// Answers `GET path` (compared percent-decoded, query ignored) with `document` from now on.
    pub fn serve(&self, path: &str, document: Value) {
        let body = serde_json::to_vec(&document).unwrap();
        self.inbox
            .documents
            .lock()
            .unwrap()
            .push((path.to_owned(), body));
    }

    /// Answers the next `PUT /send` requests with `answer`.
    pub fn set_send_answer(&self, answer: SendAnswer) {
        *self.inbox.answer.lock().unwrap() = answer;
    }

    /// Every `PUT /send` received so far, in arrival order.
    pub fn send_attempts(&self) -> Vec<SendAttempt> {
        self.inbox.attempts.lock().unwrap().clone()
    }

    /// The PDUs of the transactions answered 200, in arrival order.
    pub fn received_pdus(&self) -> Vec<Value> {
        self.send_attempts()
            .iter()
            .filter(|attempt| attempt.delivered())
            .flat_map(|attempt| attempt.body["pdus"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// The fake server's name, `localhost:{port}`.
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// `pdu` hashed and signed by this server as room version `version` wants, with its
    /// event ID (the reference hash).
    pub fn sign_pdu(&self, pdu: Value, version: &str) -> (String, Value) {
        let rules = ruma::RoomVersionId::try_from(version)
            .unwrap()
            .rules()
            .unwrap();
        let mut object: CanonicalJsonObject = serde_json::from_value(pdu).unwrap();
        ruma::signatures::hash_and_sign_event(
            self.name.as_str(),
            &*self.key_pair,
            &mut object,
            &rules.redaction,
        )
        .unwrap();
        let event_id = format!(
            "${}",
            ruma::signatures::reference_hash(&object, &rules).unwrap()
        );
        (event_id, serde_json::to_value(object).unwrap())
    }

    /// `@{localpart}:{name}`.
    pub fn user_id(&self, localpart: &str) -> String {
        format!("@{localpart}:{}", self.name)
    }

    /// The X-Matrix header for a request to `destination` (`uri` is the path and query exactly
    /// as sent).
    pub fn sign(&self, destination: &str, method: &str, uri: &str, body: Option<&Value>) -> String {
        let body = body
            .map(|b| serde_json::to_vec(b).unwrap())
            .unwrap_or_default();
        let request = http::Request::builder()
            .method(method)
            .uri(uri)
            .body(body)
            .unwrap();
        let input = XMatrixSigningInput::new(
            self.name.clone(),
            destination.try_into().unwrap(),
            &self.key_pair,
        );
        XMatrix::sign_http_request(&request, input)
            .unwrap()
            .to_string()
    }

    /// Sends a request signed by this server to `server`'s federation listener.
    pub async fn request(
        &self,
        server: &TestServer,
        method: &str,
        uri: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let header = self.sign(server.server_name(), method, uri, body.as_ref());
        let body = body.map(|b| serde_json::to_vec(&b).unwrap());
        send_raw(server, method, uri, body, Some(header)).await
    }
}

/// Sends a request to `server`'s federation listener with exactly the given body bytes and
/// `Authorization` header; answers the status and the JSON body (`Null` when not JSON).
pub async fn send_raw(
    server: &TestServer,
    method: &str,
    uri: &str,
    body: Option<Vec<u8>>,
    authorization: Option<String>,
) -> (u16, Value) {
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let mut request = https_client().request(method, format!("{}{uri}", server.federation_url()));
    if let Some(header) = authorization {
        request = request.header("authorization", header);
    }
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body);
    }
    let response = request.send().await.expect("federation request");
    let status = response.status().as_u16();
    let body = response.bytes().await.unwrap_or_default();
    (status, serde_json::from_slice(&body).unwrap_or(Value::Null))
}

/// A self-signed key document for `name`.
fn key_document(name: &OwnedServerName, key_pair: &Ed25519KeyPair) -> Vec<u8> {
    let public = Base64::<ruma::serde::base64::Standard>::new(key_pair.public_key().to_vec());
    let mut doc: CanonicalJsonObject = serde_json::from_value(serde_json::json!({
        "server_name": name,
        "verify_keys": { "ed25519:fake1": { "key": public.encode() } },
        "old_verify_keys": {},
        "valid_until_ts": 4_000_000_000_000u64,
    }))
    .unwrap();
    ruma::signatures::sign_json(name.as_str(), key_pair, &mut doc).unwrap();
    serde_json::to_vec(&CanonicalJsonValue::Object(doc)).unwrap()
}

fn tls_config(ca: &TestCa) -> rustls::ServerConfig {
    use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(ca.cert())
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(ca.key()).unwrap();
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap()
}

/// Serves fixed JSON documents over TLS (the test certificate) on `listener`: `GET path`
/// answers its document, `PUT /send/{txnId}` is recorded in `inbox` (when given) and answered
/// as it says, anything else 404.
fn serve_documents(
    listener: tokio::net::TcpListener,
    documents: Vec<(String, Vec<u8>)>,
    inbox: Option<Arc<SendInbox>>,
) -> tokio::task::JoinHandle<()> {
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls_config(test_ca())));
    let documents = Arc::new(documents);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let documents = documents.clone();
            let inbox = inbox.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(stream).await else {
                    return;
                };
                answer_one(&mut tls, &documents, inbox.as_deref()).await;
            });
        }
    })
}

/// HTTPS on a fixed address serving fixed documents, e.g. `/.well-known/matrix/server` on
/// 127.0.0.1:443 to delegate the name `localhost`.
pub struct StaticHttps {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StaticHttps {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StaticHttps {
    /// Serves `documents` on `address`; `None` when the address cannot be bound (port 443
    /// needs root).
    pub async fn bind(address: &str, documents: Vec<(&str, Value)>) -> Option<StaticHttps> {
        let listener = tokio::net::TcpListener::bind(address).await.ok()?;
        let documents = documents
            .into_iter()
            .map(|(path, doc)| (path.to_owned(), serde_json::to_vec(&doc).unwrap()))
            .collect();
        Some(StaticHttps {
            task: serve_documents(listener, documents, None),
        })
    }
}

/// The path prefix of `PUT /send/{txnId}`.
const SEND_PATH: &str = "/_matrix/federation/v1/send/";

/// Reads one request and answers it from `documents` (or `inbox`), then closes the
/// connection.
async fn answer_one<S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin>(
    stream: &mut S,
    documents: &[(String, Vec<u8>)],
    inbox: Option<&SendInbox>,
) {
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = request.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&request[..head_end]).into_owned();
    let send_txn = head
        .strip_prefix(&format!("PUT {SEND_PATH}"))
        .and_then(|rest| rest.split(' ').next())
        .map(str::to_owned);
    let mut answered: Vec<u8> = Vec::new();
    let (status, body): (String, &[u8]) = match (send_txn, inbox) {
        (Some(txn_id), Some(inbox)) => {
            let length = head
                .lines()
                .filter_map(|line| line.split_once(':'))
                .find(|(name, _)| name.eq_ignore_ascii_case("content-length"))
                .and_then(|(_, value)| value.trim().parse::<usize>().ok())
                .unwrap_or(0);
            while request.len() < head_end + length {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let body: Value =
                serde_json::from_slice(&request[head_end..head_end + length]).unwrap_or_default();
            let answer = *inbox.answer.lock().unwrap();
            // Keyed by position: the fake does not compute event IDs, and the sender only logs
            // the errors.
            let pdu_answers: serde_json::Map<String, Value> = body["pdus"]
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
                .map(|(n, _)| (format!("pdu{n}"), json!({})))
                .collect();
            inbox.attempts.lock().unwrap().push(SendAttempt {
                txn_id,
                body,
                answer,
            });
            match answer {
                SendAnswer::HangUp => {
                    let _ = stream.shutdown().await;
                    return;
                }
                SendAnswer::Accept => {
                    answered = serde_json::to_vec(&json!({ "pdus": pdu_answers })).unwrap();
                    ("200 OK".into(), &answered)
                }
                SendAnswer::RefusePdus => {
                    let refused: serde_json::Map<String, Value> = pdu_answers
                        .into_iter()
                        .map(|(key, _)| (key, json!({ "error": "refused by the fake server" })))
                        .collect();
                    answered = serde_json::to_vec(&json!({ "pdus": refused })).unwrap();
                    ("200 OK".into(), &answered)
                }
                SendAnswer::Status(code) => {
                    answered = format!(
                        r#"{{"errcode":"M_UNKNOWN","error":"fake server answers {code}"}}"#
                    )
                    .into_bytes();
                    (format!("{code} Fake"), &answered)
                }
            }
        }
        _ => {
            let found = documents.iter().find(|(path, _)| {
                request.starts_with(format!("GET {path} ").as_bytes())
                    || request.starts_with(format!("GET {path}?").as_bytes())
            });
            let target = head
                .strip_prefix("GET ")
                .and_then(|rest| rest.split([' ', '?']).next())
                .map(percent_decode);
            let added = inbox.zip(target).and_then(|(inbox, target)| {
                let documents = inbox.documents.lock().unwrap();
                documents
                    .iter()
                    .find(|(path, _)| *path == target)
                    .map(|(_, body)| body.clone())
            });
            if let Some(body) = added {
                answered = body;
            }
            let found = found
                .map(|(_, document)| document.as_slice())
                .or((!answered.is_empty()).then_some(answered.as_slice()));
            match found {
                Some(document) => ("200 OK".into(), document),
                None => (
                    "404 Not Found".into(),
                    br#"{"errcode":"M_UNRECOGNIZED","error":"fake server"}"#,
                ),
            }
        }
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body).await;
    let _ = stream.shutdown().await;
}

/// A URI path with its `%XX` escapes decoded.
fn percent_decode(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = bytes
            .get(at + 1..at + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[at], hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                at += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}
