//! Sending messages and state into a room, idempotently per client transaction.

use ruma::{EventId, OwnedEventId, RoomId, UserId};
use serde_json::Value;

use super::{
    push_actions::{silent_by_default, AudienceReads},
    writer::{common_auth_keys, NewEvent, RoomWriter},
    Rooms,
};
use crate::{
    error::{Error, Result},
    service::rate_limit::MessageOverride,
    storage::{admin_users, rooms as store, users},
};

/// How a send ended.
enum Outcome {
    /// The event was stored.
    Sent(OwnedEventId),
    /// The client's transaction ID was used before, for this event.
    Earlier(String),
    /// The sender is shadow-banned: nothing is stored.
    ShadowBanned,
}

/// Who asked for an event, which decides whether it counts against its sender's message
/// rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// The sender's client asked for it: counted, as Synapse counts `rc_message`.
    Client,
    /// The server writes it on the sender's behalf (an admin's shutdown, a deactivation, a
    /// profile change reaching every room, a delayed event coming due): never limited.
    Server,
}

impl Origin {
    /// Its `origin` label in `myelin_events_persisted_total`.
    pub fn metric_label(self) -> &'static str {
        match self {
            Origin::Client => "client",
            Origin::Server => "server",
        }
    }
}

/// Who is sending, from which device and transaction.
#[derive(Debug, Clone, Copy)]
pub struct Sender<'a> {
    /// The user.
    pub user_id: &'a UserId,
    /// Their device and the client's transaction ID, when sent through `/send`.
    pub txn: Option<(&'a str, &'a str)>,
    /// The event's `origin_server_ts` when an appservice chose it (`?ts=`); now otherwise.
    pub ts: Option<i64>,
    /// Who asked for it.
    pub origin: Origin,
}

impl Rooms {
    /// Appends one event, serialised with every other writer of the room.
    /// With a transaction ID, a retry (however late, however concurrent) returns the first
    /// event's ID and creates nothing.
    pub async fn send_event(
        &self,
        sender: Sender<'_>,
        room_id: &RoomId,
        kind: &str,
        state_key: Option<&str>,
        content: Value,
    ) -> Result<OwnedEventId> {
        let started = std::time::Instant::now();
        let result = self
            .send_event_once(sender, room_id, kind, state_key, content)
            .await;
        let kind = match (kind, state_key) {
            ("m.room.redaction", _) => "redaction",
            (_, Some(_)) => "state",
            _ => "message",
        };
        let outcome = match &result {
            Ok((_, outcome)) => *outcome,
            Err(err) if actix_web::ResponseError::status_code(err).is_client_error() => "refused",
            Err(_) => "failed",
        };
        let metrics = crate::metrics::metrics();
        metrics
            .send_requests
            .get_or_create(&crate::metrics::SendLabels { kind, outcome })
            .inc();
        if outcome == "created" {
            metrics
                .send_ack
                .get_or_create(&crate::metrics::Kind { kind })
                .observe(started.elapsed().as_secs_f64());
        }
        result.map(|(id, _)| id)
    }

    /// [`Rooms::send_event`] without the metrics; says whether the event was `created` or the
    /// transaction `replayed`.
    async fn send_event_once(
        &self,
        sender: Sender<'_>,
        room_id: &RoomId,
        kind: &str,
        state_key: Option<&str>,
        content: Value,
    ) -> Result<(OwnedEventId, &'static str)> {
        if !content.is_object() {
            return Err(Error::bad_json("Event content must be a JSON object"));
        }
        // The room lock before a connection: writers queued on a hot room hold no pooled
        // connection while they wait.
        let _room_lock = self.locks.lock(room_id).await;
        let mut conn = self.db.conn().await?;
        let user = sender.user_id.as_str();
        let server_name = &*self.config.server_name;
        let member_target = state_key.filter(|_| kind == "m.room.member");
        let prefetch = common_auth_keys(user, member_target);
        let limited = self.is_rate_limited(sender);
        let transaction_started = std::time::Instant::now();
        let result = crate::storage::transaction::room_write(&mut conn, async |conn| {
            // A retry, a shadow-banned sender, or what limits the sender's rate, is found
            // in the same round trip as the room's lock and state: most sends are neither.
            // So is what push rules need of the room, read as it is before the event.
            let prechecks = async {
                let checks = async {
                    Ok(tokio::try_join!(
                        async {
                            match sender.txn {
                                Some((device_id, txn_id)) => {
                                    store::get_txn_event(conn, user, device_id, txn_id).await
                                }
                                None => Ok(None),
                            }
                        },
                        users::is_shadow_banned(conn, user),
                        async {
                            if limited {
                                admin_users::get_message_limit(conn, user).await.map(Some)
                            } else {
                                Ok(None)
                            }
                        },
                    )?)
                };
                let audience =
                    AudienceReads::read(conn, room_id, silent_by_default(kind, &content));
                tokio::try_join!(checks, audience)
            };
            let (writer, ((earlier, shadow_banned, message_limit), audience)) =
                RoomWriter::open_with(conn, &self.keys, server_name, room_id, &prefetch, prechecks)
                    .await?;
            if let Some(id) = earlier {
                return Ok(Outcome::Earlier(id));
            }
            let mut writer = writer.with_audience_reads(audience);
            let mut content = content.clone();
            if shadow_banned {
                if !is_membership_of_self(sender, kind, state_key) {
                    return Ok(Outcome::ShadowBanned);
                }
                // Joining and leaving stay real, but carry nothing for others to read; a
                // change of name or reason alone is faked.
                let membership = content.get("membership").and_then(Value::as_str);
                if membership.is_some()
                    && membership.map(str::to_owned) == writer.current_membership(user)
                {
                    return Ok(Outcome::ShadowBanned);
                }
                if let Some(fields) = content.as_object_mut() {
                    fields.retain(|key, _| key == "membership");
                }
            }
            // Counted once the event is certain to be new (a retry of a stored
            // transaction is not), as Synapse counts at persistence.
            if let Some((is_admin, user_override)) = message_limit {
                if !is_admin {
                    self.rate_limit
                        .check_message(sender.user_id, user_override.map(message_override))?;
                }
            }
            self.check_content(&mut writer, kind, state_key, &content)
                .await?;
            let event = NewEvent {
                sender: sender.user_id,
                kind,
                state_key,
                content,
                txn: sender.txn,
                ts: sender.ts,
            };
            // A concurrent retry of the same transaction that commits first makes this
            // one fail on the transaction's unique key; its event is returned below.
            Ok(Outcome::Sent(writer.append(event).await?.event_id))
        })
        .await;
        if let Ok(Outcome::Sent(_)) = &result {
            let metrics = crate::metrics::metrics();
            metrics
                .delivery_commit
                .observe(transaction_started.elapsed().as_secs_f64());
            metrics.events_persisted(sender.origin.metric_label(), 1);
        }
        let replayed = |id: String| {
            EventId::parse(id)
                .map(|id| (id, "replayed"))
                .map_err(Error::internal)
        };
        match (result, sender.txn) {
            (Ok(Outcome::Sent(id)), _) => Ok((id, "created")),
            (Ok(Outcome::Earlier(id)), _) => replayed(id),
            // To the sender a shadow-banned send looks created; the metric says so too.
            (Ok(Outcome::ShadowBanned), _) => Ok((self.fake_send(&conn, sender).await?, "created")),
            // The same transaction ID raced in through another room or process: its event wins.
            (Err(err), Some((device_id, txn_id))) => {
                match store::get_txn_event(&conn, sender.user_id.as_str(), device_id, txn_id)
                    .await?
                {
                    Some(id) => replayed(id),
                    None => Err(err),
                }
            }
            (Err(err), None) => Err(err),
        }
    }

    /// What a shadow-banned sender gets: a plausible event ID, recorded against the transaction
    /// so retries see the same one, and nothing written to the room.
    pub(super) async fn fake_send(
        &self,
        conn: &diesel_async::AsyncPgConnection,
        sender: Sender<'_>,
    ) -> Result<OwnedEventId> {
        let event_id =
            EventId::parse(crate::service::sessions::generate_token("$").replacen("$_", "$", 1))
                .map_err(Error::internal)?;
        if let Some((device_id, txn_id)) = sender.txn {
            let _ = store::insert_txn(
                conn,
                sender.user_id.as_str(),
                device_id,
                txn_id,
                event_id.as_str(),
                crate::storage::now_ms(),
            )
            .await;
        }
        Ok(event_id)
    }

    /// Sets a state event; re-sending identical state returns the existing event, as Synapse does.
    pub async fn send_state(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        kind: &str,
        state_key: &str,
        content: Value,
    ) -> Result<OwnedEventId> {
        let sender = Sender {
            user_id,
            txn: None,
            ts: None,
            origin: Origin::Client,
        };
        self.send_state_as(sender, room_id, kind, state_key, content)
            .await
    }

    /// [`Rooms::send_state`] under a transaction ID (a delayed event's), so a retry creates
    /// nothing; a membership change takes the membership path, which has none.
    pub async fn send_state_as(
        &self,
        sender: Sender<'_>,
        room_id: &RoomId,
        kind: &str,
        state_key: &str,
        content: Value,
    ) -> Result<OwnedEventId> {
        let user_id = sender.user_id;
        if kind == "m.room.member" {
            let target = UserId::parse(state_key)
                .map_err(|_| Error::bad_json("The state key of a member event is a user ID"))?;
            return self
                .put_member_state(user_id, room_id, &target, content)
                .await;
        }
        let conn = self.db.conn().await?;
        if let Some(id) =
            store::get_current_state_id(&conn, room_id.as_str(), kind, state_key).await?
        {
            if let Some(row) = store::get_state_event(&conn, &id).await? {
                if row.sender == user_id.as_str() && row.pdu.get("content") == Some(&content) {
                    return EventId::parse(id).map_err(Error::internal);
                }
            }
        }
        drop(conn);
        self.send_event(sender, room_id, kind, Some(state_key), content)
            .await
    }

    /// Rules the auth rules do not cover: a canonical alias must point at this room.
    async fn check_content(
        &self,
        writer: &mut RoomWriter<'_>,
        kind: &str,
        state_key: Option<&str>,
        content: &Value,
    ) -> Result<()> {
        if kind == "m.room.canonical_alias" && state_key == Some("") {
            let room_id = writer.room_id()?.to_owned();
            let mut aliases: Vec<&Value> = content
                .get("alt_aliases")
                .and_then(Value::as_array)
                .map(|a| a.iter().collect())
                .unwrap_or_default();
            if let Some(alias) = content.get("alias") {
                aliases.push(alias);
            }
            for alias in aliases {
                let alias = alias
                    .as_str()
                    .ok_or_else(|| bad_alias("Aliases must be strings"))?;
                let alias_id = ruma::RoomAliasId::parse(alias)
                    .map_err(|_| bad_alias(&format!("{alias} is not a valid alias")))?;
                if alias_id.server_name() == self.config.server_name {
                    let target = store::get_alias(writer.conn(), alias)
                        .await?
                        .map(|(room, _)| room);
                    if target.as_deref() != Some(room_id.as_str()) {
                        return Err(bad_alias(&format!("{alias} does not point to this room")));
                    }
                }
            }
        }
        Ok(())
    }
}

impl Rooms {
    /// Whether a send may be refused by the message rate limit before the database says
    /// whether its sender is an admin or has an override: only what a client asks for, with
    /// limits on, and never an appservice's own user or the users of an appservice
    /// registered with `rate_limited: false`.
    fn is_rate_limited(&self, sender: Sender<'_>) -> bool {
        if sender.origin != Origin::Client || !self.rate_limit.enabled() {
            return false;
        }
        let user = sender.user_id.as_str();
        !self.config.appservices.iter().any(|registration| {
            registration.sender.as_str() == user
                || (!registration.rate_limited && registration.is_interested_in_user(user))
        })
    }
}

/// An override row `(messages_per_second, burst_count)` as the limiter takes it.
fn message_override((messages_per_second, burst_count): (i64, i64)) -> MessageOverride {
    MessageOverride {
        messages_per_second,
        burst_count,
    }
}

/// A shadow-banned user may still join and leave; everything else they send is faked.
fn is_membership_of_self(sender: Sender<'_>, kind: &str, state_key: Option<&str>) -> bool {
    kind == "m.room.member" && state_key == Some(sender.user_id.as_str())
}

fn bad_alias(message: &str) -> Error {
    Error::matrix(
        actix_web::http::StatusCode::BAD_REQUEST,
        "M_BAD_ALIAS",
        message,
    )
}

impl Rooms {
    /// Redacts an event: its sender may, and so may anyone with the room's `redact` power
    /// (the writer checks, as it does for a redaction sent through `/send`). Its transaction
    /// IDs are kept apart from `/send`'s: the same ID on both endpoints means two requests.
    pub async fn redact(
        &self,
        sender: Sender<'_>,
        room_id: &ruma::RoomId,
        event_id: &EventId,
        reason: Option<&str>,
    ) -> Result<OwnedEventId> {
        let txn_id = sender
            .txn
            .map(|(device, txn)| (device, format!("redact\u{1}{txn}")));
        let sender = Sender {
            user_id: sender.user_id,
            txn: txn_id.as_ref().map(|(device, txn)| (*device, txn.as_str())),
            ts: None,
            origin: sender.origin,
        };
        let mut content = serde_json::json!({ "redacts": event_id });
        if let Some(reason) = reason {
            content["reason"] = Value::from(reason);
        }
        self.send_event(sender, room_id, "m.room.redaction", None, content)
            .await
    }
}
