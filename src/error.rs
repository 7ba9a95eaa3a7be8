//! One error type for the whole server and its mapping onto Matrix error responses.

use std::panic::Location;

use actix_web::{http::StatusCode, HttpResponse, ResponseError};
use serde_json::{json, Map, Value};

/// Result with the server's error type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong while serving a request.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Matrix error the client is meant to see: `{"errcode", "error", ...extra}`.
    #[error("{errcode}: {message}")]
    Matrix {
        /// HTTP status of the response.
        status: StatusCode,
        /// The Matrix `errcode`, e.g. `M_FORBIDDEN`.
        errcode: &'static str,
        /// Human-readable `error` text.
        message: String,
        /// Extra top-level fields (`retry_after_ms`, `soft_logout`, ...).
        extra: Map<String, Value>,
    },
    /// User-interactive authentication is (still) required: 401 with the UIA state as body.
    #[error("user-interactive authentication required")]
    Uia(Value),
    /// Something broke inside the server; the client only learns that it was internal.
    #[error("internal error at {location}: {message}")]
    Internal {
        /// What went wrong, for the log.
        message: String,
        /// Where the error was raised.
        location: &'static Location<'static>,
    },
}

impl Error {
    /// A Matrix error with the given status, errcode and message.
    pub fn matrix(status: StatusCode, errcode: &'static str, message: impl Into<String>) -> Self {
        Error::Matrix {
            status,
            errcode,
            message: message.into(),
            extra: Map::new(),
        }
    }

    /// Adds an extra top-level field to a Matrix error.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        if let Error::Matrix { extra, .. } = &mut self {
            extra.insert(key.to_owned(), value.into());
        }
        self
    }

    /// 403 `M_FORBIDDEN`.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::matrix(StatusCode::FORBIDDEN, "M_FORBIDDEN", message)
    }

    /// 400 `M_BAD_JSON`: well-formed JSON with the wrong shape.
    pub fn bad_json(message: impl Into<String>) -> Self {
        Self::matrix(StatusCode::BAD_REQUEST, "M_BAD_JSON", message)
    }

    /// 400 `M_NOT_JSON`: the body is not JSON at all.
    pub fn not_json(message: impl Into<String>) -> Self {
        Self::matrix(StatusCode::BAD_REQUEST, "M_NOT_JSON", message)
    }

    /// 400 `M_INVALID_PARAM`.
    pub fn invalid_param(message: impl Into<String>) -> Self {
        Self::matrix(StatusCode::BAD_REQUEST, "M_INVALID_PARAM", message)
    }

    /// 400 `M_MISSING_PARAM`.
    pub fn missing_param(message: impl Into<String>) -> Self {
        Self::matrix(StatusCode::BAD_REQUEST, "M_MISSING_PARAM", message)
    }

    /// 400 `M_UNKNOWN`.
    pub fn unknown(message: impl Into<String>) -> Self {
        Self::matrix(StatusCode::BAD_REQUEST, "M_UNKNOWN", message)
    }

    /// 404 `M_NOT_FOUND`.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::matrix(StatusCode::NOT_FOUND, "M_NOT_FOUND", message)
    }

    /// `M_UNRECOGNIZED`: 404 for an unknown path, 405 for a known path with the wrong method.
    pub fn unrecognized(status: StatusCode) -> Self {
        Self::matrix(status, "M_UNRECOGNIZED", "Unrecognized request")
    }

    /// 401 `M_MISSING_TOKEN`.
    pub fn missing_token() -> Self {
        Self::matrix(
            StatusCode::UNAUTHORIZED,
            "M_MISSING_TOKEN",
            "Missing access token",
        )
    }

    /// 401 `M_UNKNOWN_TOKEN`, with `soft_logout` when the session merely expired.
    pub fn unknown_token(soft_logout: bool) -> Self {
        let message = if soft_logout {
            "Access token has expired"
        } else {
            "Unrecognised access token"
        };
        Self::matrix(StatusCode::UNAUTHORIZED, "M_UNKNOWN_TOKEN", message)
            .with("soft_logout", soft_logout)
    }

    /// 400 `M_USER_IN_USE`.
    pub fn user_in_use() -> Self {
        Self::matrix(
            StatusCode::BAD_REQUEST,
            "M_USER_IN_USE",
            "User ID already taken",
        )
    }

    /// 400 `M_INVALID_USERNAME`.
    pub fn invalid_username(message: impl Into<String>) -> Self {
        Self::matrix(StatusCode::BAD_REQUEST, "M_INVALID_USERNAME", message)
    }

    /// 429 `M_LIMIT_EXCEEDED` with `retry_after_ms`.
    pub fn limit_exceeded(retry_after_ms: u64) -> Self {
        Self::matrix(
            StatusCode::TOO_MANY_REQUESTS,
            "M_LIMIT_EXCEEDED",
            "Too many requests",
        )
        .with("retry_after_ms", retry_after_ms)
    }

    /// 413 `M_TOO_LARGE`.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::matrix(StatusCode::PAYLOAD_TOO_LARGE, "M_TOO_LARGE", message)
    }

    /// 403 `M_USER_DEACTIVATED`.
    pub fn user_deactivated() -> Self {
        Self::matrix(
            StatusCode::FORBIDDEN,
            "M_USER_DEACTIVATED",
            "This account has been deactivated",
        )
    }

    /// An internal error; the message goes to the log, never to the client.
    #[track_caller]
    pub fn internal(message: impl std::fmt::Display) -> Self {
        Error::Internal {
            message: message.to_string(),
            location: Location::caller(),
        }
    }

    /// The Matrix errcode this error is reported with.
    pub fn errcode(&self) -> &'static str {
        match self {
            Error::Matrix { errcode, .. } => errcode,
            Error::Uia(_) => "M_FORBIDDEN",
            Error::Internal { .. } => "M_UNKNOWN",
        }
    }
}

impl ResponseError for Error {
    fn status_code(&self) -> StatusCode {
        match self {
            Error::Matrix { status, .. } => *status,
            Error::Uia(_) => StatusCode::UNAUTHORIZED,
            Error::Internal { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let body = match self {
            Error::Matrix {
                errcode,
                message,
                extra,
                ..
            } => {
                let mut body = extra.clone();
                body.insert("errcode".into(), (*errcode).into());
                body.insert("error".into(), message.clone().into());
                Value::Object(body)
            }
            Error::Uia(state) => state.clone(),
            Error::Internal { message, location } => {
                tracing::error!(%location, "internal error: {message}");
                json!({ "errcode": "M_UNKNOWN", "error": "Internal server error" })
            }
        };
        HttpResponse::build(self.status_code()).json(body)
    }
}

impl From<diesel::result::Error> for Error {
    #[track_caller]
    fn from(err: diesel::result::Error) -> Self {
        Error::internal(format!("database: {err}"))
    }
}

impl From<diesel_async::pooled_connection::deadpool::PoolError> for Error {
    #[track_caller]
    fn from(err: diesel_async::pooled_connection::deadpool::PoolError) -> Self {
        Error::internal(format!("database pool: {err}"))
    }
}
