//! Building and running the HTTP server.

use std::{
    net::{SocketAddr, TcpListener},
    path::Path,
    sync::Arc,
};

use actix_web::{dev::ServerHandle, middleware::from_fn, web, App, HttpServer};

use crate::{
    api::{self, middleware::FederationPort},
    service::Services,
};

/// How many HTTP worker threads serve requests (one per core).
pub fn http_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The federation listener: its socket and TLS configuration.
pub struct FederationListener {
    /// The bound socket.
    pub listener: TcpListener,
    /// Certificate chain and key.
    pub tls: rustls::ServerConfig,
}

/// Reads a PEM certificate chain and private key into a TLS server configuration.
pub fn tls_config(cert: &Path, key: &Path) -> Result<rustls::ServerConfig, String> {
    use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("MYELIN_TLS_CERT: {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "MYELIN_TLS_CERT: {} holds no certificate",
            cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("MYELIN_TLS_KEY: {}: {e}", key.display()))?;
    rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("MYELIN_TLS_CERT/MYELIN_TLS_KEY: {e}"))
}

/// The main listener while the server starts: bound at once, so that `/health` answers and
/// `/readyz` says `starting` while the database is opened and migrated (which may take minutes),
/// and everything else gets 503.
pub struct Starting {
    listener: TcpListener,
    handle: ServerHandle,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Starting {
    /// Binds `address` and serves the probes on it.
    pub fn listen(address: SocketAddr) -> Result<Self, String> {
        let listener = TcpListener::bind(address)
            .map_err(|e| format!("cannot listen on {address} (MYELIN_LISTEN): {e}"))?;
        // The starting server gets its own descriptor of the socket: stopping it closes that
        // one, and the socket, still bound, queues connections for the real server.
        let socket = listener.try_clone().map_err(|e| e.to_string())?;
        let server = HttpServer::new(|| App::new().configure(api::health::configure_starting))
            .workers(1)
            .disable_signals()
            .shutdown_timeout(1)
            .listen(socket)
            .map_err(|e| e.to_string())?
            .run();
        let handle = server.handle();
        Ok(Starting {
            listener,
            handle,
            server: tokio::spawn(server),
        })
    }

    /// Stops serving the probes and hands the listener over for [`serve`].
    pub async fn finish(self) -> TcpListener {
        self.handle.stop(true).await;
        let _ = self.server.await;
        self.listener
    }
}

/// Binds the listeners and serves until SIGTERM or SIGINT (see [`drain_on_signal`]).
/// Prints `myelin: metrics listening on http://ADDR` for the metrics listener, then
/// `myelin: listening on http://ADDR` once the socket is bound, and
/// `myelin: federation listening on https://ADDR` for the federation listener.
pub async fn serve(
    services: Arc<Services>,
    listener: TcpListener,
    federation: Option<FederationListener>,
    metrics: Option<TcpListener>,
) -> std::io::Result<()> {
    let grace = services.config.ops.shutdown_grace;
    let draining = services.clone();
    let metrics_server = match metrics {
        Some(listener) => Some(serve_metrics(services.clone(), listener)?),
        None => None,
    };
    let address = listener.local_addr()?;
    let federation_address = federation
        .as_ref()
        .map(|f| f.listener.local_addr())
        .transpose()?;
    let federation_enabled = services.federation.enabled();
    let federation_port = web::Data::new(FederationPort(federation_address.map(|a| a.port())));
    let data = web::Data::from(services);
    let mut server = HttpServer::new(move || {
        // Runs on each worker thread as it starts.
        data.db.adopt_for_this_thread();
        App::new()
            .app_data(data.clone())
            .app_data(federation_port.clone())
            .configure(|cfg| api::configure(cfg, federation_enabled))
            .default_service(web::to(api::unknown_path))
            .wrap(from_fn(api::middleware::split_listeners))
            .wrap(from_fn(api::middleware::refuse_nul))
            .wrap(from_fn(api::middleware::cors))
            .wrap(from_fn(api::middleware::trace))
    })
    .workers(http_workers())
    // One handler for SIGTERM and SIGINT answers the parked long-polls before stopping.
    .disable_signals()
    .shutdown_timeout(grace.as_secs())
    .listen(listener)?;
    if let Some(federation) = federation {
        server = server.listen_rustls_0_23(federation.listener, federation.tls)?;
    }
    let server = server.run();
    tokio::spawn(drain_on_signal(
        draining,
        server.handle(),
        metrics_server.as_ref().map(actix_web::dev::Server::handle),
    ));
    if let Some(metrics_server) = metrics_server {
        tokio::spawn(metrics_server);
    }
    println!("myelin: listening on http://{address}");
    tracing::info!(%address, "listening");
    if let Some(address) = federation_address {
        println!("myelin: federation listening on https://{address}");
        tracing::info!(%address, "federation listening");
    }
    server.await
}

/// Waits for SIGTERM or SIGINT, then shuts down gracefully: every parked `/sync` and sliding
/// sync answers at once with a token that loses nothing, the listeners stop accepting, and
/// requests in flight (a send committing) get `MYELIN_SHUTDOWN_GRACE` to finish. The caller
/// then stops the embedded PostgreSQL. A second signal exits at once. `/readyz` answers
/// `draining` from the first signal on.
async fn drain_on_signal(
    services: Arc<Services>,
    server: actix_web::dev::ServerHandle,
    metrics: Option<actix_web::dev::ServerHandle>,
) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut terminate), Ok(mut interrupt)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install the SIGTERM/SIGINT handlers");
        return;
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = interrupt.recv() => {}
    }
    tracing::info!("shutting down: answering long-polls, finishing requests in flight");
    // Readiness fails first, so a load balancer stops sending new requests here.
    services.health.start_draining();
    services.notifier.shut_down();
    tokio::spawn(async move {
        tokio::select! {
            _ = terminate.recv() => {}
            _ = interrupt.recv() => {}
        }
        tracing::warn!("second signal: exiting without waiting");
        std::process::exit(1);
    });
    let metrics = async {
        if let Some(metrics) = metrics {
            metrics.stop(true).await;
        }
    };
    tokio::join!(metrics, server.stop(true));
}

/// Serves `GET /metrics` (Prometheus text format) on its own listener, apart from the client
/// and federation APIs, as Synapse recommends: bind it to an address only Prometheus reaches.
fn serve_metrics(
    services: Arc<Services>,
    listener: TcpListener,
) -> std::io::Result<actix_web::dev::Server> {
    let address = listener.local_addr()?;
    let data = web::Data::from(services);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route("/metrics", web::get().to(metrics_route))
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .listen(listener)?
    .run();
    println!("myelin: metrics listening on http://{address}");
    tracing::info!(%address, "metrics listening");
    Ok(server)
}

/// `GET /metrics` on the metrics listener.
async fn metrics_route(services: web::Data<Services>) -> actix_web::HttpResponse {
    crate::service::gauges::refresh(&services.db).await;
    actix_web::HttpResponse::Ok()
        .content_type(crate::metrics::CONTENT_TYPE)
        .body(crate::metrics::metrics().encode())
}
