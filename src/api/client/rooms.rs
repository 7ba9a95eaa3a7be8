//! Creating rooms, membership and the joined-rooms list.

use actix_web::{web::Data, HttpResponse};
use ruma::{
    api::client::{
        knock::knock_room::v3 as knock,
        membership::{
            ban_user::v3 as ban,
            forget_room::v3 as forget,
            get_member_events::v3 as members,
            invite_user::v3::{self as invite, InvitationRecipient},
            join_room_by_id::v3 as join_by_id,
            join_room_by_id_or_alias::v3 as join_by_id_or_alias,
            joined_members::v3 as joined_members,
            joined_rooms::v3 as joined_rooms,
            kick_user::v3 as kick,
            leave_room::v3 as leave,
            unban_user::v3 as unban,
        },
        room::{create_room::v3 as create_room, Visibility},
    },
    room::RoomType,
    serde::Raw,
};
use serde_json::{Map, Value};

use crate::{
    api::ruma::{Ruma, RumaResponse},
    error::{Error, Result},
    service::{
        rooms::{
            create::{CreateRoom, Preset},
            membership::Change,
        },
        Services,
    },
    storage::summaries::JoinedProfile,
};

fn raw_object<T>(raw: &Raw<T>, what: &str) -> Result<Map<String, Value>> {
    match serde_json::from_str(raw.json().get()) {
        Ok(Value::Object(map)) => Ok(map),
        _ => Err(Error::bad_json(format!("{what} must be a JSON object"))),
    }
}

/// `POST /_matrix/client/v3/createRoom`
pub async fn create_room_route(
    services: Data<Services>,
    body: Ruma<create_room::Request>,
) -> Result<RumaResponse<create_room::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    if let Some(name) = &request.room_alias_name {
        let alias = format!("#{name}:{}", services.config.server_name);
        services
            .appservices
            .check_alias_unclaimed(&alias, caller.appservice.as_deref())?;
    }
    let preset = request.preset.as_ref().map(|p| match p.as_str() {
        "public_chat" => Ok(Preset::PublicChat),
        "trusted_private_chat" => Ok(Preset::TrustedPrivateChat),
        "private_chat" => Ok(Preset::PrivateChat),
        other => Err(Error::bad_json(format!("Unknown preset {other}"))),
    });
    let mut initial_state = Vec::new();
    for raw in &request.initial_state {
        let event = raw_object(raw, "initial_state events")?;
        let kind = event
            .get("type")
            .and_then(Value::as_str)
            .ok_or_else(|| Error::bad_json("initial_state event without type"))?;
        let state_key = event
            .get("state_key")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let content = event
            .get("content")
            .cloned()
            .ok_or_else(|| Error::bad_json("initial_state event without content"))?;
        initial_state.push((kind.to_owned(), state_key.to_owned(), content));
    }
    let create = CreateRoom {
        preset: preset.transpose()?,
        public: request.visibility == Visibility::Public,
        alias_name: request.room_alias_name.clone(),
        name: request.name.clone(),
        topic: request.topic.clone(),
        invite: request.invite.clone(),
        is_direct: request.is_direct,
        room_version: request.room_version.clone(),
        creation_content: request
            .creation_content
            .as_ref()
            .map(|r| raw_object(r, "creation_content"))
            .transpose()?,
        initial_state,
        power_level_content_override: request
            .power_level_content_override
            .as_ref()
            .map(|r| raw_object(r, "power_level_content_override"))
            .transpose()?,
    };
    let _ = RoomType::Space; // room `type` travels inside creation_content untouched
    for invitee in &request.invite {
        services.appservices.ask_about_unknown_user(invitee).await?;
    }
    let room_id = services.rooms.create_room(&caller.user_id, create).await?;
    // Users of other servers are invited once the room exists, as /invite does it. As in
    // Synapse, an invite that fails fails the request (the room stays).
    for invitee in &request.invite {
        if services.rooms.invited_over_federation(invitee) {
            services
                .federation
                .invite_remote(
                    &services.rooms,
                    &caller.user_id,
                    &room_id,
                    invitee,
                    None,
                    request.is_direct,
                )
                .await?;
        }
    }
    Ok(create_room::Response::new(room_id).into())
}

/// `POST /_matrix/client/v3/join/{roomIdOrAlias}`
pub async fn join_by_id_or_alias_route(
    services: Data<Services>,
    body: Ruma<join_by_id_or_alias::Request>,
) -> Result<RumaResponse<join_by_id_or_alias::Response>> {
    let caller = body.caller()?;
    let room_id = join_recording_direct(
        &services,
        &caller.user_id,
        &body.body.room_id_or_alias,
        &body.body.via,
        body.body.reason.as_deref(),
    )
    .await?;
    Ok(join_by_id_or_alias::Response::new(room_id).into())
}

/// `POST /_matrix/client/v3/rooms/{roomId}/join`
pub async fn join_by_id_route(
    services: Data<Services>,
    body: Ruma<join_by_id::Request>,
) -> Result<RumaResponse<join_by_id::Response>> {
    let caller = body.caller()?;
    let room = ruma::OwnedRoomOrAliasId::from(body.body.room_id.clone());
    let room_id = join_recording_direct(
        &services,
        &caller.user_id,
        &room,
        &[],
        body.body.reason.as_deref(),
    )
    .await?;
    Ok(join_by_id::Response::new(room_id).into())
}

/// Joins a room; when the user was invited to it with `is_direct`, the room is added to their
/// `m.direct` under the inviter, as Synapse does (so every client shows it as a DM).
async fn join_recording_direct(
    services: &Services,
    user_id: &ruma::UserId,
    room: &ruma::RoomOrAliasId,
    via: &[ruma::OwnedServerName],
    reason: Option<&str>,
) -> Result<ruma::OwnedRoomId> {
    // The invite is the current membership only until the join: look it up first (a
    // remote alias is resolved by the join itself, too late for this).
    let target = match <&ruma::RoomId>::try_from(room) {
        Ok(room_id) => Some(room_id.to_owned()),
        Err(alias) if alias.server_name() == services.config.server_name => {
            services.rooms.resolve_room(room).await.ok()
        }
        Err(_) => None,
    };
    let invited_by = match &target {
        Some(room_id) => services.rooms.direct_inviter(room_id, user_id).await?,
        None => None,
    };
    let room_id = services
        .federation
        .join(&services.rooms, user_id, room, via, reason)
        .await?;
    if let Some(inviter) = invited_by {
        services
            .account_data
            .add_direct_room(user_id, &inviter, &room_id)
            .await?;
    }
    Ok(room_id)
}

/// `POST /_matrix/client/v3/knock/{roomIdOrAlias}`
pub async fn knock_route(
    services: Data<Services>,
    body: Ruma<knock::Request>,
) -> Result<RumaResponse<knock::Response>> {
    let caller = body.caller()?;
    let room_id = services
        .federation
        .knock(
            &services.rooms,
            &caller.user_id,
            &body.body.room_id_or_alias,
            &body.body.via,
            body.body.reason.as_deref(),
        )
        .await?;
    Ok(knock::Response::new(room_id).into())
}

/// `POST /_matrix/client/v3/rooms/{roomId}/leave`
pub async fn leave_route(
    services: Data<Services>,
    body: Ruma<leave::Request>,
) -> Result<RumaResponse<leave::Response>> {
    let caller = body.caller()?;
    services
        .federation
        .leave(
            &services.rooms,
            &caller.user_id,
            &body.body.room_id,
            body.body.reason.as_deref(),
        )
        .await?;
    Ok(leave::Response::new().into())
}

/// `POST /_matrix/client/v3/rooms/{roomId}/invite`
pub async fn invite_route(
    services: Data<Services>,
    body: Ruma<invite::Request>,
) -> Result<RumaResponse<invite::Response>> {
    let caller = body.caller()?;
    let InvitationRecipient::UserId(recipient) = &body.body.recipient else {
        return Err(Error::forbidden("Third-party invites are not supported"));
    };
    if recipient.user_id.server_name() != services.config.server_name
        && services.federation.enabled()
    {
        services
            .federation
            .invite_remote(
                &services.rooms,
                &caller.user_id,
                &body.body.room_id,
                &recipient.user_id,
                recipient.reason.as_deref(),
                false,
            )
            .await?;
        return Ok(invite::Response::new().into());
    }
    services
        .appservices
        .ask_about_unknown_user(&recipient.user_id)
        .await?;
    services
        .rooms
        .change_membership(
            &caller.user_id,
            &body.body.room_id,
            &recipient.user_id,
            Change::Invite,
            recipient.reason.as_deref(),
        )
        .await?;
    Ok(invite::Response::new().into())
}

/// `POST /_matrix/client/v3/rooms/{roomId}/kick`
pub async fn kick_route(
    services: Data<Services>,
    body: Ruma<kick::Request>,
) -> Result<RumaResponse<kick::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    services
        .rooms
        .change_membership(
            &caller.user_id,
            &request.room_id,
            &request.user_id,
            Change::Kick,
            request.reason.as_deref(),
        )
        .await?;
    Ok(kick::Response::new().into())
}

/// `POST /_matrix/client/v3/rooms/{roomId}/ban`
pub async fn ban_route(
    services: Data<Services>,
    body: Ruma<ban::Request>,
) -> Result<RumaResponse<ban::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    services
        .rooms
        .change_membership(
            &caller.user_id,
            &request.room_id,
            &request.user_id,
            Change::Ban,
            request.reason.as_deref(),
        )
        .await?;
    Ok(ban::Response::new().into())
}

/// `POST /_matrix/client/v3/rooms/{roomId}/unban`
pub async fn unban_route(
    services: Data<Services>,
    body: Ruma<unban::Request>,
) -> Result<RumaResponse<unban::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    services
        .rooms
        .change_membership(
            &caller.user_id,
            &request.room_id,
            &request.user_id,
            Change::Unban,
            request.reason.as_deref(),
        )
        .await?;
    Ok(unban::Response::new().into())
}

/// `POST /_matrix/client/v3/rooms/{roomId}/forget`
pub async fn forget_route(
    services: Data<Services>,
    body: Ruma<forget::Request>,
) -> Result<RumaResponse<forget::Response>> {
    let caller = body.caller()?;
    services
        .rooms
        .forget(&caller.user_id, &body.body.room_id)
        .await?;
    Ok(forget::Response::new().into())
}

/// `GET /_matrix/client/v3/joined_rooms`
pub async fn joined_rooms_route(
    services: Data<Services>,
    body: Ruma<joined_rooms::Request>,
) -> Result<RumaResponse<joined_rooms::Response>> {
    let caller = body.caller()?;
    Ok(joined_rooms::Response::new(services.rooms.joined_rooms(&caller.user_id).await?).into())
}

/// `GET /_matrix/client/v3/rooms/{roomId}/joined_members`
/// (written straight from the rows: a room of thousands is not turned into ruma's types and
/// back).
pub async fn joined_members_route(
    services: Data<Services>,
    body: Ruma<joined_members::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let profiles = services
        .rooms
        .joined_members(&caller.user_id, &body.body.room_id)
        .await?;
    Ok(HttpResponse::Ok().json(JoinedMembers {
        joined: Joined(&profiles),
    }))
}

/// `/joined_members`' answer, serialised as it is read.
#[derive(serde::Serialize)]
struct JoinedMembers<'a> {
    joined: Joined<'a>,
}

/// Each joined member's profile by user ID.
struct Joined<'a>(&'a [JoinedProfile]);

impl serde::Serialize for Joined<'_> {
    fn serialize<S: serde::Serializer>(
        &self,
        serializer: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Profile<'p> {
            #[serde(skip_serializing_if = "Option::is_none")]
            display_name: Option<&'p str>,
            #[serde(skip_serializing_if = "Option::is_none")]
            avatar_url: Option<&'p str>,
        }
        serializer.collect_map(self.0.iter().map(|member| {
            let profile = Profile {
                display_name: member.display_name.as_deref(),
                avatar_url: member.avatar_url.as_deref(),
            };
            (&member.user_id, profile)
        }))
    }
}

/// `GET /_matrix/client/v3/rooms/{roomId}/members`
pub async fn members_route(
    services: Data<Services>,
    body: Ruma<members::Request>,
) -> Result<RumaResponse<members::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    let events = services
        .rooms
        .members(
            &caller.user_id,
            &request.room_id,
            request.membership.as_ref().map(|m| m.as_str()),
            request.not_membership.as_ref().map(|m| m.as_str()),
            request
                .at
                .as_deref()
                .map(crate::service::sync::token::parse_pagination)
                .transpose()?,
        )
        .await?;
    let chunk = events.into_iter().map(Raw::from_json).collect();
    Ok(members::Response::new(chunk).into())
}

/// Wraps a JSON value as a ruma `Raw`.
pub(crate) fn to_raw<T>(value: &Value) -> Result<Raw<T>> {
    Ok(Raw::from_json(
        serde_json::value::to_raw_value(value).map_err(Error::internal)?,
    ))
}

/// `POST /_matrix/client/v3/rooms/{roomId}/upgrade`
pub async fn upgrade_route(
    services: Data<Services>,
    body: Ruma<ruma::api::client::room::upgrade_room::v3::Request>,
) -> Result<RumaResponse<ruma::api::client::room::upgrade_room::v3::Response>> {
    let caller = body.caller()?;
    let request = &body.body;
    let new_room = services
        .rooms
        .upgrade_room(
            &caller.user_id,
            &request.room_id,
            request.new_version.clone(),
            request.additional_creators.clone(),
        )
        .await?;
    Ok(ruma::api::client::room::upgrade_room::v3::Response::new(new_room).into())
}
