//! Sliding sync extensions: thin adapters over what `/sync` already serves (to-device inbox,
//! key counts and device lists, account data, receipts, typing).

use std::{
    borrow::Cow,
    collections::{BTreeMap, HashMap, HashSet},
};

use diesel_async::AsyncPgConnection;
use ruma::push::Ruleset;
use serde_json::{json, Map, Value};

use super::{
    model::{self, SlidingRequest},
    scoped,
};
use crate::{
    error::{Error, Result},
    service::{
        e2ee::{
            keys::{device_list_delta, one_time_key_counts},
            to_device,
        },
        push_rules::{push_rules_event, PUSH_RULES_TYPE},
        sync::{token::SyncToken, Sync},
    },
    storage::{
        account_data as account_store, e2ee as e2ee_store, streams, to_device as to_device_store,
    },
};

/// Which rooms the response covers, for the extensions' scoping.
pub struct Scopes<'a> {
    /// Each list's window.
    pub windows: &'a BTreeMap<&'a str, Vec<&'a str>>,
    /// Subscribed rooms the user has a membership in.
    pub subscribed: &'a [&'a str],
    /// Rooms sent in this response: whether first sent (or its timeline grew), and the
    /// IDs of its timeline's events.
    pub sent: &'a HashMap<&'a str, (bool, &'a [String])>,
    /// Whether a membership changed since `pos` in any of the user's rooms (only then can
    /// someone have come to share or stopped sharing a room with the user).
    pub memberships_moved: bool,
}

impl Sync {
    /// The `extensions` object, and whether it carries nothing worth returning for.
    pub(super) async fn sliding_extensions(
        &self,
        conn: &AsyncPgConnection,
        request: &SlidingRequest,
        scopes: Scopes<'_>,
        (since, next): (Option<SyncToken>, SyncToken),
        ignored: &HashSet<String>,
        positions: &streams::Positions,
    ) -> Result<(Value, bool)> {
        let user = request.user_id.as_str();
        let device = request.device_id.as_str();
        let wanted = &request.extensions;
        // Extensions usually all cover everything: that set is made once.
        let everything = [&wanted.account_data, &wanted.receipts, &wanted.typing]
            .into_iter()
            .flatten()
            .any(model::Scope::covers_everything)
            .then(|| scoped(&model::Scope::default(), scopes.windows, scopes.subscribed));
        let in_scope = |scope: &model::Scope| match &everything {
            Some(all) if scope.covers_everything() => Cow::Borrowed(all),
            _ => Cow::Owned(scoped(scope, scopes.windows, scopes.subscribed)),
        };

        // The extensions that read the database go out together, pipelined on `conn`; each
        // gives its JSON and whether it carries nothing.
        let to_device = async {
            let Some(ext) = &wanted.to_device else {
                return Ok::<_, Error>(None);
            };
            let up_to = positions.persisted(to_device_store::TO_DEVICE);
            let since_td = ext.since.unwrap_or(0);
            let (events, reached) = if since_td > up_to {
                // A token ahead of the server: nothing yet, and the token stays.
                (Vec::new(), since_td)
            } else {
                // At most `limit` (100 at most) per response.
                to_device::take_up_to(conn, (user, device), (since_td, up_to), ext.limit).await?
            };
            let value = json!({ "next_batch": reached.to_string(), "events": events });
            Ok(Some((value, events.is_empty())))
        };

        let e2ee = async {
            if !wanted.e2ee {
                return Ok::<_, Error>(None);
            }
            // Key counts, fallback keys and the device-list delta, read together.
            let (counts, fallback, delta) = tokio::try_join!(
                one_time_key_counts(conn, user, device),
                async { Ok(e2ee_store::get_unused_fallback_algorithms(conn, user, device).await?) },
                async {
                    let Some(since) = since else {
                        return Ok(None);
                    };
                    let memberships_to = if scopes.memberships_moved {
                        next.events
                    } else {
                        since.events
                    };
                    device_list_delta(
                        conn,
                        user,
                        (since.device_lists, next.device_lists),
                        (since.events, memberships_to),
                    )
                    .await
                    .map(Some)
                },
            )?;
            let mut e2ee = json!({
                "device_one_time_keys_count": counts,
                "device_unused_fallback_key_types": fallback,
            });
            let mut empty = true;
            if let Some((changed, left)) = delta {
                empty = changed.is_empty() && left.is_empty();
                e2ee["device_lists"] = json!({ "changed": changed, "left": left });
            }
            Ok(Some((e2ee, empty)))
        };

        let account_data = async {
            let Some(scope) = &wanted.account_data else {
                return Ok::<_, Error>(None);
            };
            let rooms = in_scope(scope);
            let from = since.map_or(0, |s| s.account_data);
            let mut entries = if from < next.account_data {
                account_store::get_account_data_changed(conn, user, from, next.account_data).await?
            } else {
                Vec::new()
            };
            // Rooms sent for the first time get all their room account data.
            let first_sent: HashSet<&str> = rooms
                .iter()
                .filter(|r| scopes.sent.get(*r).is_some_and(|(fresh, _)| *fresh))
                .copied()
                .collect();
            if from > 0 && !first_sent.is_empty() {
                entries.extend(
                    account_store::get_account_data_changed(conn, user, 0, from)
                        .await?
                        .into_iter()
                        .filter(|(room, _, _)| first_sent.contains(room.as_str())),
                );
            }
            let mut global = Vec::new();
            let mut by_room: BTreeMap<String, Vec<Value>> = BTreeMap::new();
            for (room_id, kind, content) in entries {
                let event = json!({ "type": kind, "content": content });
                if room_id.is_empty() {
                    global.push(event);
                } else if rooms.contains(room_id.as_str()) {
                    by_room.entry(room_id).or_default().push(event);
                }
            }
            if since.is_none() && !global.iter().any(|e| e["type"] == PUSH_RULES_TYPE) {
                global.push(push_rules_event(&Ruleset::server_default(&request.user_id)));
            }
            let empty = global.is_empty() && by_room.is_empty();
            Ok(Some((json!({ "global": global, "rooms": by_room }), empty)))
        };

        let receipts = async {
            let Some(scope) = &wanted.receipts else {
                return Ok::<_, Error>(None);
            };
            let rooms = in_scope(scope);
            let (fresh, live): (Vec<&str>, Vec<&str>) = rooms
                .iter()
                .partition(|r| since.is_none() || scopes.sent.get(*r).is_some_and(|(f, _)| *f));
            let fresh: Vec<String> = fresh.into_iter().map(str::to_owned).collect();
            let mut by_room = Map::new();
            // A room sent afresh: the receipts on its timeline and the user's own.
            let fresh_receipts = match fresh.is_empty() {
                true => Default::default(),
                false => self.receipts(conn, &fresh, 0, next.receipts, user).await?,
            };
            for (room_id, mut event) in fresh_receipts {
                let timeline: HashSet<&str> = scopes
                    .sent
                    .get(room_id.as_str())
                    .map(|(_, ids)| ids.iter().map(String::as_str).collect())
                    .unwrap_or_default();
                if let Some(content) = event["content"].as_object_mut() {
                    content.retain(|event_id, by_type| {
                        if timeline.contains(event_id.as_str()) {
                            return true;
                        }
                        if let Some(by_type) = by_type.as_object_mut() {
                            for readers in by_type.values_mut() {
                                if let Some(readers) = readers.as_object_mut() {
                                    readers.retain(|reader, _| reader == user);
                                }
                            }
                            by_type.retain(|_, readers| {
                                readers.as_object().is_some_and(|r| !r.is_empty())
                            });
                            return !by_type.is_empty();
                        }
                        false
                    });
                    if content.is_empty() {
                        continue;
                    }
                }
                by_room.insert(room_id, event);
            }
            if let Some(since) = since.filter(|s| s.receipts < next.receipts) {
                let live: Vec<String> = live.into_iter().map(str::to_owned).collect();
                for (room_id, event) in self
                    .receipts(conn, &live, since.receipts, next.receipts, user)
                    .await?
                {
                    by_room.insert(room_id, event);
                }
            }
            let empty = by_room.is_empty();
            Ok(Some((json!({ "rooms": by_room }), empty)))
        };

        let (to_device, e2ee, account_data, receipts) =
            tokio::try_join!(to_device, e2ee, account_data, receipts)?;
        let mut out = Map::new();
        let mut empty = true;
        for (name, part) in [
            ("to_device", to_device),
            ("e2ee", e2ee),
            ("account_data", account_data),
            ("receipts", receipts),
        ] {
            if let Some((value, part_empty)) = part {
                empty &= part_empty;
                out.insert(name.into(), value);
            }
        }

        if let Some(scope) = &wanted.typing {
            // Rooms sent afresh get who is typing now; the others what changed since `pos`.
            let (fresh, live): (Vec<&str>, Vec<&str>) = in_scope(scope)
                .iter()
                .partition(|r| scopes.sent.get(*r).is_some_and(|(f, _)| *f));
            let typing = &self.notifier.typing;
            let mut changed = typing.changed_since(fresh, None, next.typing);
            changed.extend(typing.changed_since(live, since.map(|s| s.typing), next.typing));
            let mut by_room = Map::new();
            for (room_id, users) in changed {
                let users: Vec<String> =
                    users.into_iter().filter(|u| !ignored.contains(u)).collect();
                by_room.insert(
                    room_id,
                    json!({ "type": "m.typing", "content": { "user_ids": users } }),
                );
            }
            empty &= by_room.is_empty();
            out.insert("typing".into(), json!({ "rooms": by_room }));
        }
        Ok((Value::Object(out), empty))
    }
}
