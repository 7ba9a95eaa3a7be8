//! Pushers: clients register where their notifications should be pushed (`/pushers/set`).

use std::sync::Arc;

use actix_web::http::StatusCode;
use ruma::{
    api::client::push::{set_pusher::v3::PusherAction, Pusher},
    UserId,
};
use serde_json::{json, Value};

use crate::{
    error::{Error, Result},
    service::outbound::{Outbound, OutboundError},
    storage::{
        now_ms,
        pushers::{self as store, PusherRow},
        streams, Db,
    },
};

/// The only path a push gateway URL may have (as the spec and Synapse require).
const GATEWAY_PATH: &str = "/_matrix/push/v1/notify";
/// Longest `app_id` (as Synapse).
const MAX_APP_ID_LENGTH: usize = 64;
/// Longest `pushkey` (as Synapse).
const MAX_PUSHKEY_LENGTH: usize = 512;
/// Most pushers one user may have (each drains on its own task; Synapse has no cap).
pub const MAX_PUSHERS_PER_USER: i64 = 100;

/// The pushers service.
pub struct Pushers {
    db: Db,
    outbound: Arc<Outbound>,
}

/// The client form of a stored pusher.
fn pusher_json(row: &PusherRow) -> Value {
    let mut pusher = json!({
        "pushkey": row.pushkey,
        "app_id": row.app_id,
        "kind": row.kind,
        "app_display_name": row.app_display_name,
        "device_display_name": row.device_display_name,
        "lang": row.lang,
        "data": row.data,
    });
    if let Some(tag) = &row.profile_tag {
        pusher["profile_tag"] = Value::from(tag.as_str());
    }
    pusher
}

/// Checks an HTTP pusher's `data.url`: an http(s) gateway URL that is not an address the
/// server may not reach (names are checked again on every connection).
fn check_gateway_url(outbound: &Outbound, data: &Value) -> Result<()> {
    let url = data
        .get("url")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::missing_param("HTTP pushers need data.url"))?;
    let parsed = outbound.check_url(url).map_err(|err| match err {
        OutboundError::Refused(why) => Error::invalid_param(format!("data.url: {why}")),
        _ => Error::invalid_param("data.url must be an absolute http or https URL"),
    })?;
    if parsed.path() != GATEWAY_PATH {
        return Err(Error::invalid_param(format!(
            "data.url must have the path {GATEWAY_PATH}"
        )));
    }
    Ok(())
}

impl Pushers {
    /// Creates the service.
    pub fn new(db: Db, outbound: Arc<Outbound>) -> Self {
        Pushers { db, outbound }
    }

    /// The user's pushers in their client form.
    pub async fn list(&self, user_id: &UserId) -> Result<Vec<Value>> {
        let conn = self.db.conn().await?;
        let rows = store::get_pushers_of_user(&conn, user_id.as_str()).await?;
        Ok(rows.iter().map(pusher_json).collect())
    }

    /// Adds, replaces or deletes a pusher. A new pusher only pushes events from now on.
    pub async fn set(&self, user_id: &UserId, device_id: &str, action: PusherAction) -> Result<()> {
        let mut conn = self.db.conn().await?;
        let post = match action {
            PusherAction::Delete(ids) => {
                store::delete_pusher(&conn, user_id.as_str(), &ids.app_id, &ids.pushkey).await?;
                return Ok(());
            }
            PusherAction::Post(post) => post,
            _ => return Err(Error::invalid_param("Unsupported pusher action")),
        };
        let row = self.row(user_id, device_id, &post.pusher)?;
        let append = post.append;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            let mut row = row;
            row.last_stream_ordering = streams::persisted(conn, streams::EVENTS).await?;
            if !append {
                store::delete_pushers_of_others(conn, &row.user_id, &row.app_id, &row.pushkey)
                    .await?;
            }
            let others =
                store::count_other_pushers(conn, &row.user_id, &row.app_id, &row.pushkey).await?;
            if others >= MAX_PUSHERS_PER_USER {
                return Err(Error::matrix(
                    StatusCode::BAD_REQUEST,
                    "M_LIMIT_EXCEEDED",
                    format!(
                        "A user may have at most {MAX_PUSHERS_PER_USER} pushers; delete one first"
                    ),
                ));
            }
            store::upsert_pusher(conn, &row).await?;
            Ok(())
        })
        .await
    }

    fn row(&self, user_id: &UserId, device_id: &str, pusher: &Pusher) -> Result<PusherRow> {
        let wire = serde_json::to_value(pusher).map_err(Error::internal)?;
        let kind = wire.get("kind").and_then(Value::as_str).unwrap_or_default();
        if kind != "http" {
            return Err(Error::invalid_param(format!(
                "Pusher kind {kind:?} is not supported (only http)"
            )));
        }
        let data = wire.get("data").cloned().unwrap_or_else(|| json!({}));
        check_gateway_url(&self.outbound, &data)?;
        let ids = &pusher.ids;
        if ids.app_id.is_empty() || ids.app_id.len() > MAX_APP_ID_LENGTH {
            return Err(Error::invalid_param(format!(
                "app_id must be 1 to {MAX_APP_ID_LENGTH} bytes"
            )));
        }
        if ids.pushkey.is_empty() || ids.pushkey.len() > MAX_PUSHKEY_LENGTH {
            return Err(Error::invalid_param(format!(
                "pushkey must be 1 to {MAX_PUSHKEY_LENGTH} bytes"
            )));
        }
        Ok(PusherRow {
            user_id: user_id.to_string(),
            app_id: ids.app_id.clone(),
            pushkey: ids.pushkey.clone(),
            kind: kind.to_owned(),
            app_display_name: pusher.app_display_name.clone(),
            device_display_name: pusher.device_display_name.clone(),
            profile_tag: pusher.profile_tag.clone(),
            lang: pusher.lang.clone(),
            data,
            device_id: Some(device_id.to_owned()),
            created_ts: now_ms(),
            last_stream_ordering: 0,
        })
    }
}
