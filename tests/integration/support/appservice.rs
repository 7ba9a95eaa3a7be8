//! A fake application service on loopback: it records the transactions, pings and queries the
//! server sends it and answers them with a status the test chooses (or, for paths the test
//! gives, with the JSON it gives), and a registration file for it.

use std::{
    path::PathBuf,
    sync::{
        atomic::{AtomicU16, Ordering},
        Arc, Mutex,
    },
};

use rand::Rng;
use serde_json::Value;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpListener,
};

use super::{Client, ServerOptions, TestServer};

/// One request the fake appservice received.
#[derive(Debug, Clone)]
pub struct Received {
    /// `PUT`, `POST`, ...
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// The query string (without `?`), as sent.
    pub query: String,
    /// The `Authorization` header.
    pub authorization: String,
    /// The JSON body.
    pub body: Value,
    /// The status it was answered with.
    pub status: u16,
}

/// A running fake appservice and its registration.
pub struct FakeAppservice {
    /// The appservice's token (towards the server).
    pub as_token: String,
    /// The server's token (towards the appservice).
    pub hs_token: String,
    /// The registration file.
    pub file: PathBuf,
    status: Arc<AtomicU16>,
    received: Arc<Mutex<Vec<Received>>>,
    answers: Answers,
    task: tokio::task::JoinHandle<()>,
}

/// JSON answers for given paths: `(path, body)`.
type Answers = Arc<Mutex<Vec<(String, Value)>>>;

/// What a fake appservice's registration says beyond the usual.
pub struct FakeRegistration<'a> {
    /// Its `id`; its sender is `{id}bot`.
    pub id: &'a str,
    /// Its users and aliases namespaces: `@{prefix}.*` and `#{prefix}.*` on the server.
    pub prefix: &'a str,
    /// Whether they are exclusive.
    pub exclusive: bool,
    /// Whether it asks for ephemeral events (`receive_ephemeral`).
    pub receive_ephemeral: bool,
    /// More top-level YAML lines (`org.matrix.msc3202: true`, `protocols: [irc]`, ...).
    pub extra: &'a str,
}

impl Default for FakeRegistration<'_> {
    fn default() -> Self {
        FakeRegistration {
            id: "echo",
            prefix: "echo_",
            exclusive: true,
            receive_ephemeral: true,
            extra: "",
        }
    }
}

impl Drop for FakeAppservice {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.file);
    }
}

fn token() -> String {
    format!("{:032x}", rand::rng().random::<u128>())
}

impl FakeAppservice {
    /// Starts it and writes its registration (id `echo`, sender `echobot`, users
    /// `@echo_.*`, aliases `#echo_.*`, both exclusive, ephemeral events on) for `server_name`.
    pub async fn start(server_name: &str) -> FakeAppservice {
        Self::start_with(server_name, FakeRegistration::default()).await
    }

    /// Starts one with the registration `setup` describes.
    pub async fn start_with(server_name: &str, setup: FakeRegistration<'_>) -> FakeAppservice {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let status = Arc::new(AtomicU16::new(200));
        let received = Arc::new(Mutex::new(Vec::new()));
        let answers: Answers = Arc::default();
        let (answer, seen, canned) = (status.clone(), received.clone(), answers.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let (answer, seen, canned) = (answer.clone(), seen.clone(), canned.clone());
                tokio::spawn(async move {
                    // Keep-alive: several requests may come on one connection.
                    while let Some(mut request) = read_request(&mut socket).await {
                        let given = canned
                            .lock()
                            .unwrap()
                            .iter()
                            .find(|(path, _)| *path == request.path)
                            .map(|(_, body)| body.to_string());
                        let status = if given.is_some() {
                            200
                        } else {
                            answer.load(Ordering::SeqCst)
                        };
                        request.status = status;
                        seen.lock().unwrap().push(request);
                        let body = match given {
                            Some(body) => body,
                            None if status == 200 => "{}".to_owned(),
                            None => r#"{"errcode":"M_UNKNOWN","error":"down"}"#.to_owned(),
                        };
                        let response = format!(
                            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        if socket.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let (as_token, hs_token) = (token(), token());
        let escaped = regex_escape(server_name);
        let FakeRegistration {
            id,
            prefix,
            exclusive,
            receive_ephemeral,
            extra,
        } = setup;
        let yaml = format!(
            "id: {id}\nurl: {url}\nas_token: {as_token}\nhs_token: {hs_token}\n\
             sender_localpart: {id}bot\nrate_limited: false\nreceive_ephemeral: {receive_ephemeral}\n\
             namespaces:\n  users:\n    - regex: '@{prefix}.*:{escaped}'\n      exclusive: {exclusive}\n\
             \x20 aliases:\n    - regex: '#{prefix}.*:{escaped}'\n      exclusive: {exclusive}\n{extra}\n"
        );
        let file = std::env::temp_dir().join(format!("myelin-as-{}.yaml", token()));
        std::fs::write(&file, yaml).unwrap();
        FakeAppservice {
            as_token,
            hs_token,
            file,
            status,
            received,
            answers,
            task,
        }
    }

    /// Server options with this appservice registered.
    pub fn options(&self, options: ServerOptions) -> ServerOptions {
        options.env("MYELIN_APPSERVICES", self.file.to_str().unwrap())
    }

    /// Server options with all of `appservices` registered.
    pub fn options_for(appservices: &[&FakeAppservice], options: ServerOptions) -> ServerOptions {
        let files: Vec<&str> = appservices
            .iter()
            .map(|a| a.file.to_str().unwrap())
            .collect();
        options.env("MYELIN_APPSERVICES", &files.join(","))
    }

    /// Answers requests for `path` with `body` (and 200) from now on.
    pub fn answer_path(&self, path: &str, body: Value) {
        self.answers.lock().unwrap().push((path.to_owned(), body));
    }

    /// Answers every request with `status` from now on.
    pub fn answer(&self, status: u16) {
        self.status.store(status, Ordering::SeqCst);
    }

    /// Every request so far.
    pub fn received(&self) -> Vec<Received> {
        self.received.lock().unwrap().clone()
    }

    /// The transaction attempts so far: `(txn_id, body, status)`.
    pub fn transactions(&self) -> Vec<(u64, Value, u16)> {
        self.received()
            .into_iter()
            .filter(|r| r.method == "PUT")
            .filter_map(|r| {
                let id = r.path.strip_prefix("/_matrix/app/v1/transactions/")?;
                Some((id.parse().ok()?, r.body, r.status))
            })
            .collect()
    }

    /// The events of the transactions answered 200, in arrival order.
    pub fn delivered_events(&self) -> Vec<Value> {
        self.transactions()
            .into_iter()
            .filter(|(_, _, status)| *status == 200)
            .flat_map(|(_, body, _)| body["events"].as_array().cloned().unwrap_or_default())
            .collect()
    }

    /// A client authenticated with the appservice's token.
    pub fn client(&self, server: &TestServer) -> Client {
        let mut client = server.client();
        client.token = Some(self.as_token.clone());
        client
    }
}

fn regex_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| match c {
            '.' | '[' | ']' | '(' | ')' | '*' | '+' | '?' | '^' | '$' | '|' | '\\' => {
                vec!['\\', c]
            }
            c => vec![c],
        })
        .collect()
}

/// Reads one HTTP request (head and `Content-Length` body); `None` when the peer is gone.
async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<Received> {
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(at) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).into_owned();
    let header = |name: &str| {
        head.lines()
            .filter_map(|line| line.split_once(':'))
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.trim().to_owned())
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while data.len() < head_end + length {
        let n = socket.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        data.extend_from_slice(&buf[..n]);
    }
    let mut first = head.lines().next()?.split(' ');
    let method = first.next()?.to_owned();
    let target = first.next()?;
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    Some(Received {
        method,
        path: path.to_owned(),
        query: query.to_owned(),
        authorization: header("authorization").unwrap_or_default(),
        body: serde_json::from_slice(&data[head_end..head_end + length]).unwrap_or_default(),
        status: 0,
    })
}
