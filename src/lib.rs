//! Myelin: a Matrix homeserver.
//!
//! Layers, one way only: [`api`] (HTTP) -> [`service`] (domain logic) -> [`storage`] (SQL).

pub mod allocator;
pub mod api;
pub mod config;
pub mod embedded_pg;
pub mod error;
pub mod healthcheck;
pub mod limits;
pub mod metrics;
pub mod net;
pub mod server;
pub mod service;
pub mod storage;
