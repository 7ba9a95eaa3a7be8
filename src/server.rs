//! Building and running the HTTP server.

use std::{net::TcpListener, sync::Arc};

use actix_web::{middleware::from_fn, web, App, HttpServer};

use crate::{api, service::Services};

/// How many HTTP worker threads serve requests (one per core).
pub fn http_workers() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Binds the listener and serves until the process is asked to stop.
/// Prints `myelin: listening on http://ADDR` once the socket is bound.
pub async fn serve(services: Arc<Services>, listener: TcpListener) -> std::io::Result<()> {
    let address = listener.local_addr()?;
    let data = web::Data::from(services);
    let server = HttpServer::new(move || {
        // Runs on each worker thread as it starts.
        data.db.adopt_for_this_thread();
        App::new()
            .app_data(data.clone())
            .configure(api::configure)
            .default_service(web::to(api::unknown_path))
            .wrap(from_fn(api::middleware::refuse_nul))
            .wrap(from_fn(api::middleware::cors))
            .wrap(from_fn(api::middleware::trace))
    })
    .workers(http_workers())
    // Long-polls would otherwise hold a shutdown for their whole timeout.
    .shutdown_timeout(3)
    .listen(listener)?
    .run();
    println!("myelin: listening on http://{address}");
    tracing::info!(%address, "listening");
    server.await
}
