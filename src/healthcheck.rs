//! `myelin healthcheck`: asks a running server's `/health` whether it is alive, for Docker's
//! `HEALTHCHECK` (the image then needs no curl).

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::Duration,
};

/// How long the whole probe may take: Docker counts a hung probe as a failure anyway.
const TIMEOUT: Duration = Duration::from_secs(3);

/// The `/health` URL of a server listening on `listen`; an unspecified address (`0.0.0.0`,
/// `[::]`) is reached on loopback.
pub fn local_health_url(listen: SocketAddr) -> String {
    let ip = match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}/health", SocketAddr::new(ip, listen.port()))
}

/// GETs `url` and succeeds when it answers 200 with the body `OK`.
pub async fn probe(url: &str) -> Result<(), String> {
    let client = reqwest::Client::builder()
        .timeout(TIMEOUT)
        .no_proxy()
        .build()
        .map_err(|e| e.to_string())?;
    let response = client
        .get(url)
        .send()
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    let status = response.status();
    let body = response.text().await.map_err(|e| format!("{url}: {e}"))?;
    if status == reqwest::StatusCode::OK && body.trim() == "OK" {
        Ok(())
    } else {
        Err(format!(
            "{url}: {status}: {}",
            body.chars().take(200).collect::<String>()
        ))
    }
}
