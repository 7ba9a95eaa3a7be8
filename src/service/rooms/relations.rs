//! Relations: edits (`m.replace`), reactions (`m.annotation`), threads (`m.thread`) and
//! references (`m.reference`). Checked and recorded in the event's own transaction, bundled
//! into `unsigned.m.relations` on every read path, and listed through `/relations` and
//! `/threads`.

use std::collections::{HashMap, HashSet};

use diesel_async::AsyncPgConnection;
use ruma::{room_version_rules::RoomVersionRules, RoomId, UserId};
use serde_json::{json, Value};

use super::{visibility::Visibility, Rooms};
use crate::{
    error::{Error, Result},
    service::sync::token,
    storage::{
        relations::{self as store, RelationRow},
        rooms::{self as rooms_store, EventRow},
    },
};

/// Longest page of `/relations` and `/threads`.
const MAX_PAGE: i64 = 100;
/// Page length when the client does not say.
const DEFAULT_PAGE: i64 = 20;

fn duplicate_annotation() -> Error {
    Error::matrix(
        actix_web::http::StatusCode::BAD_REQUEST,
        "M_DUPLICATE_ANNOTATION",
        "You already reacted with this key",
    )
}

/// The relation a new event declares, checked against what it relates to. Errors for what
/// Synapse refuses (a relation across rooms, a duplicate reaction, a thread off an event that
/// itself relates to something); `None` for no relation, or for an edit the spec says to
/// ignore (other sender, other type, a state event, an edit of an edit): such an event is
/// stored but never replaces anything.
pub async fn check(
    conn: &AsyncPgConnection,
    room_id: &RoomId,
    sender: &UserId,
    kind: &str,
    state_key: Option<&str>,
    content: &Value,
) -> Result<Option<RelationRow>> {
    let Some(relation) = content.get("m.relates_to") else {
        return Ok(None);
    };
    let (Some(rel_type), Some(target_id)) = (
        relation.get("rel_type").and_then(Value::as_str),
        relation.get("event_id").and_then(Value::as_str),
    ) else {
        // Replies (`m.in_reply_to`) and malformed relations are not aggregated.
        return Ok(None);
    };
    let Some(target) = rooms_store::get_event(conn, target_id).await? else {
        return Ok(None);
    };
    if target.room_id != room_id.as_str() {
        return Err(Error::invalid_param(
            "An event can only relate to an event in the same room",
        ));
    }
    let key = relation
        .get("key")
        .and_then(Value::as_str)
        .map(str::to_owned);
    match rel_type {
        "m.annotation" => {
            let Some(key) = &key else {
                return Err(Error::bad_json("An annotation needs a key"));
            };
            if store::has_annotation(conn, target_id, sender.as_str(), kind, key).await? {
                return Err(duplicate_annotation());
            }
        }
        "m.thread" if store::get_relation(conn, target_id).await?.is_some() => {
            return Err(Error::invalid_param(
                "Cannot start a thread from an event that relates to another",
            ));
        }
        "m.replace" => {
            let target_is_edit = store::get_relation(conn, target_id)
                .await?
                .is_some_and(|r| r.rel_type == "m.replace");
            if target.sender != sender.as_str()
                || target.event_type != kind
                || target.state_key.is_some()
                || state_key.is_some()
                || target_is_edit
            {
                return Ok(None);
            }
        }
        _ => {}
    }
    Ok(Some(RelationRow {
        event_id: String::new(),
        relates_to: target_id.to_owned(),
        rel_type: rel_type.to_owned(),
        room_id: room_id.to_string(),
        sender: sender.to_string(),
        event_type: kind.to_owned(),
        aggregation_key: key.filter(|_| rel_type == "m.annotation"),
        stream_ordering: 0,
    }))
}

impl Rooms {
    /// Renders timeline events with their bundled relations.
    pub(crate) async fn render_with_relations(
        &self,
        conn: &AsyncPgConnection,
        rules: &RoomVersionRules,
        user_id: &UserId,
        rows: &[EventRow],
    ) -> Result<Vec<Value>> {
        let mut events = self.render(conn, rules, rows).await?;
        self.bundle_relations(conn, rules, user_id, &mut events)
            .await?;
        Ok(events)
    }

    /// Renders timeline events with their bundled relations, from relations read for these
    /// events (and maybe others: a sync reads them for many rooms at once).
    pub(crate) async fn render_with_bundled(
        &self,
        conn: &AsyncPgConnection,
        rules: &RoomVersionRules,
        user_id: &UserId,
        rows: &[EventRow],
        bundled: &store::Bundled,
    ) -> Result<Vec<Value>> {
        let mut events = self.render(conn, rules, rows).await?;
        let parents: HashSet<&str> = rows
            .iter()
            .filter(|row| row.state_key.is_none())
            .map(|row| row.event_id.as_str())
            .collect();
        let bundled = bundled.of_parents(&parents);
        self.add_bundled(conn, rules, user_id, &mut events, bundled)
            .await?;
        Ok(events)
    }

    /// Adds `unsigned.m.relations` to rendered events of one room: the latest valid edit
    /// (`m.replace`, the whole event), the thread summary (`m.thread`: `latest_event`, `count`,
    /// `current_user_participated`) and references (`m.reference`).
    pub(crate) async fn bundle_relations(
        &self,
        conn: &AsyncPgConnection,
        rules: &RoomVersionRules,
        user_id: &UserId,
        events: &mut [Value],
    ) -> Result<()> {
        let ids: Vec<String> = events
            .iter()
            .filter(|e| e.get("state_key").is_none())
            .filter_map(|e| e["event_id"].as_str().map(str::to_owned))
            .collect();
        if ids.is_empty() {
            return Ok(());
        }
        let bundled = store::get_bundled(conn, &ids, user_id.as_str()).await?;
        self.add_bundled(conn, rules, user_id, events, bundled)
            .await
    }

    /// [`Rooms::bundle_relations`] with the relations read: only what the user may see of
    /// them is bundled, and a redaction's reason only when they may see the redaction.
    async fn add_bundled(
        &self,
        conn: &AsyncPgConnection,
        rules: &RoomVersionRules,
        user_id: &UserId,
        events: &mut [Value],
        bundled: store::Bundled,
    ) -> Result<()> {
        let store::Bundled {
            edits,
            threads,
            references,
        } = bundled;
        let redactions: Vec<String> = events
            .iter()
            .filter_map(|e| e["unsigned"]["redacted_because"]["event_id"].as_str())
            .map(str::to_owned)
            .collect();
        if edits.is_empty() && threads.is_empty() && references.is_empty() && redactions.is_empty()
        {
            return Ok(());
        }
        // Bundled events are served too: the reader sees only those visible to them (a
        // departed user gets no edit, reply or redaction reason written after they left).
        let wanted: Vec<String> = edits
            .iter()
            .map(|(_, edit)| edit.clone())
            .chain(threads.iter().map(|t| t.latest.clone()))
            .chain(references.iter().map(|(_, child)| child.clone()))
            .chain(redactions)
            .collect();
        let rows = Visibility::new(user_id).filter_ids(conn, &wanted).await?;
        let visible: HashSet<String> = rows.iter().map(|r| r.event_id.clone()).collect();
        let rendered: HashMap<String, Value> = self
            .render(conn, rules, &rows)
            .await?
            .into_iter()
            .filter_map(|e| Some((e["event_id"].as_str()?.to_owned(), e)))
            .collect();
        for event in events.iter_mut() {
            let Some(id) = event["event_id"].as_str().map(str::to_owned) else {
                continue;
            };
            if let Some(redaction) = event
                .get_mut("unsigned")
                .and_then(|unsigned| unsigned.get_mut("redacted_because"))
                .filter(|r| {
                    r["event_id"]
                        .as_str()
                        .is_some_and(|id| !visible.contains(id))
                })
            {
                redaction["content"] = json!({});
            }
            let mut bundled = serde_json::Map::new();
            if let Some(edit) = edits
                .iter()
                .find(|(parent, _)| *parent == id)
                .and_then(|(_, edit)| rendered.get(edit))
            {
                bundled.insert("m.replace".into(), edit.clone());
            }
            if let Some(thread) = threads
                .iter()
                .find(|t| t.root == id && visible.contains(&t.latest))
            {
                let started = event["sender"] == user_id.as_str();
                bundled.insert(
                    "m.thread".into(),
                    json!({
                        "latest_event": rendered.get(&thread.latest),
                        "count": thread.count,
                        "current_user_participated": thread.participated || started,
                    }),
                );
            }
            let referencing: Vec<Value> = references
                .iter()
                .filter(|(parent, child)| *parent == id && visible.contains(child))
                .map(|(_, child)| json!({ "event_id": child }))
                .collect();
            if !referencing.is_empty() {
                bundled.insert("m.reference".into(), json!({ "chunk": referencing }));
            }
            if !bundled.is_empty() {
                event["unsigned"]["m.relations"] = Value::Object(bundled);
            }
        }
        Ok(())
    }

    /// `GET /v1/rooms/{id}/relations/{eventId}[/{relType}[/{eventType}]]`: the children the
    /// user may see, newest first by default, with `next_batch`/`prev_batch` tokens.
    #[allow(clippy::too_many_arguments)]
    pub async fn relations(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        parent: &str,
        rel_type: Option<&str>,
        event_type: Option<&str>,
        from: Option<&str>,
        to: Option<&str>,
        forwards: bool,
        limit: Option<u64>,
    ) -> Result<Value> {
        let conn = self.db.conn().await?;
        let (rules, _) = self.visible_event(&conn, user_id, room_id, parent).await?;
        // Children page in stream order.
        let stream = |t: &str| token::parse_pagination(t).map(token::Pagination::stream);
        let from = from.map(stream).transpose()?;
        let to = to.map(stream).transpose()?;
        let limit = limit.map_or(DEFAULT_PAGE, |l| (l as i64).clamp(1, MAX_PAGE));
        let page = store::page_children(
            &conn, parent, rel_type, event_type, from, to, !forwards, limit,
        )
        .await?;
        let ids: Vec<String> = page.iter().map(|(id, _)| id.clone()).collect();
        let visible: Vec<EventRow> = Visibility::new(user_id)
            .filter_ids(&conn, &ids)
            .await?
            .into_iter()
            .filter(|row| row.redacted_by.is_none())
            .collect();
        let chunk = self.render(&conn, &rules, &visible).await?;
        let mut answer = json!({ "chunk": chunk });
        if page.len() as i64 == limit {
            if let Some((_, last)) = page.last() {
                answer["next_batch"] = Value::from(token::stream_pagination(*last));
            }
        }
        if let Some(from) = from {
            answer["prev_batch"] = Value::from(token::stream_pagination(from));
        }
        Ok(answer)
    }

    /// `GET /v1/rooms/{id}/threads`: thread roots by latest activity, newest first, each with
    /// its summary; `participated_only` keeps threads the user started or replied to.
    pub async fn threads(
        &self,
        user_id: &UserId,
        room_id: &RoomId,
        participated_only: bool,
        from: Option<&str>,
        limit: Option<u64>,
    ) -> Result<Value> {
        let conn = self.db.conn().await?;
        let (rules, _) = self.room_rules(&conn, room_id).await?;
        let before = from
            .map(|t| token::parse_pagination(t).map(token::Pagination::stream))
            .transpose()?
            .unwrap_or(i64::MAX);
        let limit = limit.map_or(DEFAULT_PAGE, |l| (l as i64).clamp(1, MAX_PAGE));
        let participant = participated_only.then_some(user_id.as_str());
        let threads =
            store::get_threads(&conn, room_id.as_str(), participant, before, limit).await?;
        let ids: Vec<String> = threads.iter().map(|(root, _)| root.clone()).collect();
        let roots = Visibility::new(user_id).filter_ids(&conn, &ids).await?;
        if roots.is_empty() && !self.is_joined(&conn, room_id, user_id).await? {
            return Err(Error::forbidden("You are not in this room"));
        }
        let mut chunk = self.render(&conn, &rules, &roots).await?;
        self.bundle_relations(&conn, &rules, user_id, &mut chunk)
            .await?;
        let mut answer = json!({ "chunk": chunk });
        if threads.len() as i64 == limit {
            if let Some((_, latest)) = threads.last() {
                answer["next_batch"] = Value::from(token::stream_pagination(*latest));
            }
        }
        Ok(answer)
    }
}
