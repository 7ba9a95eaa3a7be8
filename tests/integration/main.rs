//! Integration tests: the real `myelin` binary over HTTP against a real PostgreSQL.
//!
//! Each test gets its own database (cloned from a migrated template) and its own server
//! process, so tests run in parallel.

mod account_security;
mod accounts;
mod api_spec;
mod appservices;
mod client_lookups;
mod dehydrated_devices;
mod delayed_events;
mod devices;
mod e2ee;
mod errors;
mod event_dag;
mod federation;
mod federation_auth;
mod federation_backfill;
mod federation_e2ee;
mod federation_edus;
mod federation_knock;
mod federation_pdu_sending;
mod federation_pdus;
mod federation_queries;
mod federation_reads;
mod federation_robustness;
mod federation_rooms;
mod federation_sender;
mod federation_spaces;
mod media;
mod membership_paths;
mod migrations;
mod presence;
mod profile_and_account_data;
mod pushers;
mod receipts;
mod redaction_paths;
mod relations;
mod reports;
mod room_summary;
mod rooms;
mod search;
mod sliding_sync;
mod sliding_sync_extensions;
mod sliding_sync_rooms;
mod spaces;
mod startup;
mod state_resolution;
mod support;
mod sync;
mod sync_concurrency;
mod typing;
mod unread;
mod url_previews;
mod visibility_paths;
mod voip;
mod write_path;
