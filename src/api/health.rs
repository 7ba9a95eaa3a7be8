//! Liveness and readiness probes, for Docker, orchestrators and load balancers. Both are served
//! on every listener and logged below INFO.

use actix_web::{http::StatusCode, web, web::Data, HttpResponse};
use serde_json::json;

use crate::{
    error::Error,
    service::{health::Readiness, Services},
};

/// The liveness path.
pub const HEALTH_PATH: &str = "/health";
/// The readiness path.
pub const READY_PATH: &str = "/readyz";

/// Whether a path is one of the probes (served on every listener, logged at DEBUG).
pub fn is_probe_path(path: &str) -> bool {
    path == HEALTH_PATH || path == READY_PATH
}

/// `GET /health`: `200 OK` in plain text, as Synapse answers. Liveness only: it touches no
/// database and stays 200 while the process starts or drains, so nothing restarts a process
/// that is merely busy.
pub async fn health_route() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("OK")
}

/// `GET /readyz`: 200 `{"status":"ready"}` when this process should be sent traffic, 503 with
/// the reason (`starting`, `draining`, `database_unavailable`, `listener_down`) otherwise.
pub async fn readyz_route(services: Data<Services>) -> HttpResponse {
    readiness_response(services.health.readiness().await)
}

fn readiness_response(readiness: Readiness) -> HttpResponse {
    let status = match readiness {
        Readiness::Ready => StatusCode::OK,
        _ => StatusCode::SERVICE_UNAVAILABLE,
    };
    HttpResponse::build(status).json(json!({ "status": readiness.as_str() }))
}

/// The routes served while the server starts (before the database is migrated): the probes,
/// and 503 `M_UNKNOWN` for everything else, so a client retries instead of giving up.
pub fn configure_starting(cfg: &mut web::ServiceConfig) {
    cfg.route(HEALTH_PATH, web::get().to(health_route))
        .route(
            READY_PATH,
            web::get().to(|| async { readiness_response(Readiness::Starting) }),
        )
        .default_service(web::to(|| async {
            let error = Error::matrix(
                StatusCode::SERVICE_UNAVAILABLE,
                "M_UNKNOWN",
                "The server is starting",
            );
            actix_web::ResponseError::error_response(&error)
        }));
}
