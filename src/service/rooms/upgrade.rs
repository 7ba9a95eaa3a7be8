//! Room upgrades: a new room of another version carries the old room's state over, and the
//! old room gets a tombstone pointing at it. Everything happens in one transaction.

use ruma::{OwnedRoomId, OwnedUserId, RoomId, RoomVersionId, UserId};
use serde_json::{json, Value};

use super::{
    create::membership_content,
    deferred::DeferredPositions,
    versions::version_rules,
    writer::{NewEvent, RoomWriter},
    Rooms,
};
use crate::{
    error::{Error, Result},
    storage::{memberships as membership_store, rooms as store},
};

/// State that moves to the replacement room, in the order it is sent there.
const COPIED_STATE: [&str; 9] = [
    "m.room.join_rules",
    "m.room.history_visibility",
    "m.room.guest_access",
    "m.room.name",
    "m.room.topic",
    "m.room.avatar",
    "m.room.encryption",
    "m.room.server_acl",
    "m.room.canonical_alias",
];

impl Rooms {
    /// Upgrades a room to `new_version`; only users who may send `m.room.tombstone` can.
    pub async fn upgrade_room(
        &self,
        user_id: &UserId,
        old_room: &RoomId,
        new_version: RoomVersionId,
        additional_creators: Vec<OwnedUserId>,
    ) -> Result<OwnedRoomId> {
        let new_rules = version_rules(&new_version)?;
        // The room lock before a connection (see `RoomLocks`), and before the reads the
        // upgrade is built from, so no local writer changes them in between.
        let _old_room_lock = self.locks.lock(old_room).await;
        let mut conn = self.db.conn().await?;
        self.ensure_room_exists(&conn, old_room).await?;
        if !self.is_joined(&conn, old_room, user_id).await? {
            return Err(Error::forbidden("You are not in this room"));
        }
        if !self
            .can_send_state(&conn, old_room, user_id, "m.room.tombstone")
            .await?
        {
            return Err(Error::forbidden(
                "You do not have the power to upgrade this room",
            ));
        }
        let levels = self.power_levels(&conn, old_room).await?;
        let user_level = self.user_level(&conn, old_room, user_id, &levels).await?;
        let mut copied = Vec::new();
        for kind in COPIED_STATE {
            if let Some(id) =
                store::get_current_state_id(&conn, old_room.as_str(), kind, "").await?
            {
                if let Some(event) = store::get_state_event(&conn, &id).await? {
                    copied.push((kind, event.pdu.get("content").cloned().unwrap_or_default()));
                }
            }
        }
        let old_create =
            match store::get_current_state_id(&conn, old_room.as_str(), "m.room.create", "").await?
            {
                Some(id) => store::get_state_event(&conn, &id)
                    .await?
                    .and_then(|e| e.pdu.get("content").cloned()),
                None => None,
            }
            .unwrap_or_default();
        // Bans carry over, or every banned user could walk into the replacement room.
        let mut bans = Vec::new();
        for banned in membership_store::get_room_members(&conn, old_room.as_str(), "ban").await? {
            if let Some(event) =
                store::get_current_state_event(&conn, old_room.as_str(), "m.room.member", &banned)
                    .await?
            {
                let mut content = json!({ "membership": "ban" });
                if let Some(reason) = event.pdu.pointer("/content/reason") {
                    content["reason"] = reason.clone();
                }
                bans.push((banned, content));
            }
        }
        let profile = self.member_profile(&conn, user_id).await?;
        let server_name = &*self.config.server_name;

        let (new_room, persisted) = crate::storage::transaction::transaction(&mut conn, async |conn| {
            // The replacement room.
            let room_id = (!new_rules.authorization.room_create_event_id_as_room_id).then(|| self.random_room_id());
            // Both rooms' events at provisional positions, made real in one step before commit.
            let deferred = DeferredPositions::default();
            let mut writer = RoomWriter::create(conn, &self.keys, server_name, room_id, new_version.clone())?
                .with_deferred_positions(&deferred);
            let mut create = json!({ "room_version": new_version.as_str(), "predecessor": { "room_id": old_room } });
            if let Some(kind) = old_create.get("type") {
                create["type"] = kind.clone();
            }
            if let Some(federate) = old_create.get("m.federate") {
                create["m.federate"] = federate.clone();
            }
            if !new_rules.authorization.use_room_create_sender {
                create["creator"] = json!(user_id);
            }
            let privileged = new_rules.authorization.explicitly_privilege_room_creators;
            if privileged && !additional_creators.is_empty() {
                create["additional_creators"] = json!(additional_creators);
            }
            let mut new_levels = levels.clone();
            if let Some(users) = new_levels.get_mut("users").and_then(Value::as_object_mut) {
                if privileged {
                    users.remove(user_id.as_str());
                    for creator in &additional_creators {
                        users.remove(creator.as_str());
                    }
                } else {
                    users.insert(user_id.to_string(), json!(user_level.min(i64::from(i32::MAX))));
                }
            } else if !privileged {
                new_levels["users"] = json!({ user_id.as_str(): user_level });
            }
            let mut events = vec![
                ("m.room.create", String::new(), create),
                ("m.room.member", user_id.to_string(), membership_content("join", &profile, None)),
                ("m.room.power_levels", String::new(), new_levels),
            ];
            events.extend(copied.iter().map(|(kind, content)| (*kind, String::new(), content.clone())));
            for (kind, state_key, content) in events {
                writer
                    .append(NewEvent { sender: user_id, kind, state_key: Some(&state_key), content, txn: None, ts: None })
                    .await?;
            }
            for (banned, content) in &bans {
                let ban = NewEvent { sender: user_id, kind: "m.room.member", state_key: Some(banned), content: content.clone(), txn: None, ts: None };
                if !append_if_allowed(&mut writer, ban).await? {
                    tracing::warn!(%banned, "upgrade: the upgrader cannot ban this user in the new room");
                }
            }
            let new_room = writer.room_id()?.to_owned();
            store::move_aliases(writer.conn(), old_room.as_str(), new_room.as_str()).await?;
            if store::get_room(writer.conn(), old_room.as_str()).await?.is_some_and(|r| r.is_public) {
                store::set_room_public(writer.conn(), old_room.as_str(), false).await?;
                store::set_room_public(writer.conn(), new_room.as_str(), true).await?;
            }
            drop(writer);

            // The tombstone, and the old room quietened so people move over.
            let mut old = RoomWriter::open(conn, &self.keys, server_name, old_room, &[])
                .await?
                .with_deferred_positions(&deferred);
            let tombstone = json!({ "body": "This room has been replaced", "replacement_room": new_room });
            old.append(NewEvent { sender: user_id, kind: "m.room.tombstone", state_key: Some(""), content: tombstone, txn: None, ts: None })
                .await?;
            let users_default = levels.get("users_default").and_then(Value::as_i64).unwrap_or(0);
            let restricted = 50.max(users_default + 1);
            let mut old_levels = levels.clone();
            let mut changed = false;
            for key in ["events_default", "invite"] {
                if old_levels.get(key).and_then(Value::as_i64).unwrap_or(0) < restricted {
                    old_levels[key] = json!(restricted);
                    changed = true;
                }
            }
            if changed {
                // An upgrader who may tombstone but not change power levels still upgrades;
                // the old room just stays as open as it was (refused before anything is
                // written, so the transaction goes on).
                let quieten = NewEvent { sender: user_id, kind: "m.room.power_levels", state_key: Some(""), content: old_levels, txn: None, ts: None };
                if !append_if_allowed(&mut old, quieten).await? {
                    tracing::info!(room_id = %old_room, "upgrade: the upgrader cannot restrict the old room's power levels");
                }
            }
            let persisted = deferred.finish(old.conn(), &[&new_room, old_room]).await?;
            Ok((new_room, persisted))
        })
        .await?;
        crate::metrics::metrics()
            .events_persisted(super::send::Origin::Client.metric_label(), persisted);
        Ok(new_room)
    }
}

/// Appends an event unless the auth rules refuse it (`false`). A refusal comes before the
/// writer writes anything, so the transaction carries on.
async fn append_if_allowed(writer: &mut RoomWriter<'_>, event: NewEvent<'_>) -> Result<bool> {
    match writer.append(event).await {
        Ok(_) => Ok(true),
        Err(Error::Matrix {
            errcode: "M_FORBIDDEN",
            ..
        }) => Ok(false),
        Err(err) => Err(err),
    }
}
