//! The Server-Server API: handlers for requests from other homeservers. Every endpoint but the
//! key and version documents is authenticated by X-Matrix in the [`Ruma`] extractor, so a
//! handler always knows the origin server.

pub mod directory;
pub mod discovery;
pub mod events;
pub mod keys;
pub mod media;
pub mod membership;
pub mod openid;
pub mod query;
pub mod send;
pub mod spaces;

use ::ruma::api::federation as f;

use super::RouteTable;

/// Whether a path belongs to the federation surface (served on the federation listener).
pub fn is_federation_path(path: &str) -> bool {
    path.starts_with("/_matrix/federation/") || path.starts_with("/_matrix/key/")
}

/// The federation route table.
pub fn routes(t: &mut RouteTable) {
    t.ruma::<f::discovery::get_server_keys::v2::Request, _, _>(discovery::server_keys_route);
    t.ruma::<f::discovery::get_server_version::v1::Request, _, _>(discovery::version_route);
    t.ruma::<f::query::get_profile_information::v1::Request, _, _>(query::query_profile_route);
    t.ruma::<f::query::get_room_information::v1::Request, _, _>(query::query_directory_route);
    t.ruma::<f::directory::get_public_rooms::v1::Request, _, _>(directory::public_rooms_route);
    t.ruma::<f::directory::get_public_rooms_filtered::v1::Request, _, _>(
        directory::public_rooms_filtered_route,
    );
    t.ruma::<f::openid::get_openid_userinfo::v1::Request, _, _>(openid::openid_userinfo_route);
    t.ruma::<f::authenticated_media::get_content::v1::Request, _, _>(media::media_download_route);
    t.ruma::<f::authenticated_media::get_content_thumbnail::v1::Request, _, _>(
        media::media_thumbnail_route,
    );
    t.ruma::<f::device::get_devices::v1::Request, _, _>(keys::user_devices_route);
    t.ruma::<f::keys::get_keys::v1::Request, _, _>(keys::keys_query_route);
    t.ruma::<f::keys::claim_keys::v1::Request, _, _>(keys::keys_claim_route);
    t.ruma::<f::transactions::send_transaction_message::v1::Request, _, _>(
        send::send_transaction_route,
    );
    t.ruma::<f::event::get_event::v1::Request, _, _>(events::get_event_route);
    t.ruma::<f::event::get_room_state::v1::Request, _, _>(events::get_room_state_route);
    t.ruma::<f::event::get_room_state_ids::v1::Request, _, _>(events::get_room_state_ids_route);
    t.ruma::<f::authorization::get_event_authorization::v1::Request, _, _>(
        events::get_event_authorization_route,
    );
    t.ruma::<f::backfill::get_backfill::v1::Request, _, _>(events::get_backfill_route);
    t.ruma::<f::event::get_missing_events::v1::Request, _, _>(events::get_missing_events_route);
    t.ruma::<f::event::get_event_by_timestamp::v1::Request, _, _>(events::timestamp_to_event_route);
    t.ruma::<f::membership::prepare_join_event::v1::Request, _, _>(membership::make_join_route);
    t.ruma::<f::membership::create_join_event::v2::Request, _, _>(membership::send_join_route);
    t.ruma::<f::membership::create_invite::v2::Request, _, _>(membership::invite_route);
    t.ruma::<f::membership::prepare_leave_event::v1::Request, _, _>(membership::make_leave_route);
    t.ruma::<f::membership::create_leave_event::v2::Request, _, _>(membership::send_leave_route);
    t.ruma::<f::membership::prepare_knock_event::v1::Request, _, _>(membership::make_knock_route);
    t.ruma::<f::membership::create_knock_event::v1::Request, _, _>(membership::send_knock_route);
    t.ruma::<f::space::get_hierarchy::v1::Request, _, _>(spaces::hierarchy_route);
}
