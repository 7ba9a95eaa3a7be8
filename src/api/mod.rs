//! HTTP layer: the route table, middleware and handlers. Handlers are thin: they take the
//! caller from the extractor, call services and build the response.

pub mod admin;
pub mod client;
pub mod client_ip;
pub mod federation;
pub mod health;
pub mod middleware;
pub mod ruma;

use std::collections::BTreeMap;

use ::ruma::api::{path_builder::PathBuilder, IncomingRequest};
use actix_web::{
    http::{Method, StatusCode},
    web, FromRequest, Handler, HttpResponse, Responder, Route,
};

use crate::error::Error;

/// Collects routes, grouped by path so a known path with the wrong method gets 405.
#[derive(Default)]
pub struct RouteTable {
    routes: BTreeMap<String, Vec<(Method, Option<Route>)>>,
    build_handlers: bool,
    /// The routes registered now are long-polls (see [`RouteTable::long_polls`]).
    long_polls: bool,
}

impl RouteTable {
    /// Registers a ruma endpoint under all its stable paths (including legacy `r0`).
    pub fn ruma<R, F, Args>(&mut self, handler: F) -> &mut Self
    where
        R: IncomingRequest,
        F: Handler<Args> + Clone,
        Args: FromRequest + 'static,
        F::Output: Responder + 'static,
    {
        let method =
            Method::from_bytes(R::METHOD.as_str().as_bytes()).expect("ruma methods are valid");
        for path in R::PATH_BUILDER
            .all_paths()
            .filter(|p| !p.contains("/unstable/"))
        {
            self.raw(method.clone(), path, handler.clone());
            // The spec lets clients omit an empty state key, with or without the trailing slash.
            if let Some(without_key) = path.strip_suffix("/{state_key}") {
                self.raw(method.clone(), without_key, handler.clone());
                self.raw(method.clone(), &format!("{without_key}/"), handler.clone());
            }
        }
        self
    }

    /// Registers the routes `register` adds as long-polls: a request's headers move into a map
    /// of their own size before it runs ([`middleware::CompactHeaders`]), since it may wait a
    /// minute and ten thousand may wait at once.
    pub fn long_polls(&mut self, register: impl FnOnce(&mut Self)) -> &mut Self {
        self.long_polls = true;
        register(self);
        self.long_polls = false;
        self
    }

    /// Registers a handler for one method and path.
    pub fn raw<F, Args>(&mut self, method: Method, path: &str, handler: F) -> &mut Self
    where
        F: Handler<Args>,
        Args: FromRequest + 'static,
        F::Output: Responder + 'static,
    {
        let route = self.build_handlers.then(|| {
            let route = web::method(method.clone()).to(handler);
            match self.long_polls {
                true => route.wrap(middleware::CompactHeaders),
                false => route,
            }
        });
        self.routes
            .entry(path.to_owned())
            .or_default()
            .push((method, route));
        self
    }

    /// Every `(method, path)` served, sorted.
    pub fn list(&self) -> Vec<(String, String)> {
        let mut list: Vec<_> = self
            .routes
            .iter()
            .flat_map(|(path, methods)| {
                methods
                    .iter()
                    .map(move |(m, _)| (m.to_string(), path.clone()))
            })
            .collect();
        list.sort();
        list
    }

    /// Registers the routes as a tree of scopes, one level per path segment. actix tries a
    /// level's services one by one and runs a regex for each pattern with a parameter
    /// (`regex-lite`, no literal prefilter: every try reads the path up to where it fails);
    /// a scope's prefix is tried once for all the routes under it, so a send, 20 routes down
    /// the rooms, tries a handful of patterns instead of every one before it.
    fn register(self, cfg: &mut web::ServiceConfig) {
        let paths = self
            .routes
            .into_iter()
            .map(|(path, methods)| {
                let routes = methods
                    .into_iter()
                    .map(|(_, r)| r.expect("handlers are built for registration"))
                    .collect();
                (path, routes)
            })
            .collect();
        for service in nest(paths) {
            cfg.service(service);
        }
    }
}

/// A route or a scope of routes.
enum RouteNode {
    Resource(actix_web::Resource),
    Scope(actix_web::Scope),
}

impl actix_web::dev::HttpServiceFactory for RouteNode {
    fn register(self, config: &mut actix_web::dev::AppService) {
        match self {
            RouteNode::Resource(resource) => resource.register(config),
            RouteNode::Scope(scope) => scope.register(config),
        }
    }
}

/// The services for `paths`, each relative to the scope they go in (`/segment/...`, or empty
/// for the scope's own path), grouped by their first segment. A group of several paths gets
/// a scope of its own only where no sibling can match the same segment: a parameter's group
/// when it is the level's only group, a literal's when the level has no parameter (actix
/// takes the first scope whose prefix matches, and never comes back out of it). The rest stay
/// routes of their own, literals first (`{` sorts after them), as actix tries them in order.
fn nest(paths: Vec<(String, Vec<Route>)>) -> Vec<RouteNode> {
    let mut groups: BTreeMap<String, Vec<(String, Vec<Route>)>> = BTreeMap::new();
    let mut services = Vec::new();
    for (path, routes) in paths {
        let Some(rest) = path.strip_prefix('/') else {
            services.push(RouteNode::Resource(resource(&path, routes)));
            continue;
        };
        let (segment, tail) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        groups
            .entry(segment.to_owned())
            .or_default()
            .push((tail.to_owned(), routes));
    }
    let has_parameter = groups.keys().any(|segment| segment.contains('{'));
    let group_count = groups.len();
    for (segment, members) in groups {
        let alone = match segment.contains('{') {
            true => group_count == 1,
            false => !has_parameter,
        };
        if alone && members.len() > 1 && !segment.is_empty() {
            let scope = nest(members)
                .into_iter()
                .fold(web::scope(&format!("/{segment}")), |scope, service| {
                    scope.service(service)
                });
            services.push(RouteNode::Scope(scope));
        } else {
            for (tail, routes) in members {
                let path = format!("/{segment}{tail}");
                services.push(RouteNode::Resource(resource(&path, routes)));
            }
        }
    }
    services
}

fn resource(path: &str, routes: Vec<Route>) -> actix_web::Resource {
    let mut resource = web::resource(path).default_service(web::to(method_not_allowed));
    for route in routes {
        resource = resource.route(route);
    }
    resource
}

async fn method_not_allowed() -> HttpResponse {
    actix_web::ResponseError::error_response(&Error::unrecognized(StatusCode::METHOD_NOT_ALLOWED))
}

/// Answers any path no route knows with 404 `M_UNRECOGNIZED`.
pub async fn unknown_path() -> HttpResponse {
    actix_web::ResponseError::error_response(&Error::unrecognized(StatusCode::NOT_FOUND))
}

/// The route table: one line per endpoint.
fn routes(t: &mut RouteTable) {
    use ::ruma::api::client as r;
    use client::*;

    t.raw(Method::GET, health::HEALTH_PATH, health::health_route);
    t.raw(Method::GET, health::READY_PATH, health::readyz_route);
    t.raw(
        Method::GET,
        "/.well-known/matrix/client",
        discovery::well_known_client_route,
    );
    t.raw(
        Method::GET,
        "/.well-known/matrix/server",
        discovery::well_known_server_route,
    );
    t.ruma::<r::discovery::get_supported_versions::Request, _, _>(discovery::versions_route);
    t.ruma::<r::discovery::get_capabilities::v3::Request, _, _>(discovery::capabilities_route);

    t.ruma::<r::account::register::v3::Request, _, _>(register::register_route);
    t.ruma::<r::account::get_username_availability::v3::Request, _, _>(
        register::username_available_route,
    );
    t.ruma::<r::account::check_registration_token_validity::v1::Request, _, _>(
        register::token_validity_route,
    );

    t.ruma::<r::session::get_login_types::v3::Request, _, _>(session::get_login_types_route);
    t.ruma::<r::session::login::v3::Request, _, _>(session::login_route);
    t.ruma::<r::session::logout::v3::Request, _, _>(session::logout_route);
    t.ruma::<r::session::logout_all::v3::Request, _, _>(session::logout_all_route);
    t.ruma::<r::session::refresh_token::v3::Request, _, _>(session::refresh_route);
    t.ruma::<r::account::whoami::v3::Request, _, _>(account::whoami_route);
    t.ruma::<r::appservice::request_ping::v1::Request, _, _>(appservice::ping_route);
    t.ruma::<r::account::request_openid_token::v3::Request, _, _>(
        account::request_openid_token_route,
    );

    t.ruma::<r::account::change_password::v3::Request, _, _>(account::change_password_route);
    t.ruma::<r::account::deactivate::v3::Request, _, _>(account::deactivate_route);

    t.ruma::<r::profile::get_profile::v3::Request, _, _>(profile::get_profile_route);
    t.ruma::<r::profile::get_profile_field::v3::Request, _, _>(profile::get_profile_field_route);
    t.ruma::<r::profile::set_profile_field::v3::Request, _, _>(profile::set_profile_field_route);
    t.ruma::<r::profile::delete_profile_field::v3::Request, _, _>(
        profile::delete_profile_field_route,
    );

    t.ruma::<r::device::get_devices::v3::Request, _, _>(devices::get_devices_route);
    t.ruma::<r::device::get_device::v3::Request, _, _>(devices::get_device_route);
    t.ruma::<r::device::update_device::v3::Request, _, _>(devices::update_device_route);
    t.ruma::<r::device::delete_device::v3::Request, _, _>(devices::delete_device_route);
    t.ruma::<r::device::delete_devices::v3::Request, _, _>(devices::delete_devices_route);

    t.ruma::<r::config::get_global_account_data::v3::Request, _, _>(account_data::get_global_route);
    t.ruma::<r::config::set_global_account_data::v3::Request, _, _>(account_data::set_global_route);
    t.ruma::<r::config::get_room_account_data::v3::Request, _, _>(account_data::get_room_route);
    t.ruma::<r::config::set_room_account_data::v3::Request, _, _>(account_data::set_room_route);
    t.ruma::<r::tag::get_tags::v3::Request, _, _>(tags::get_tags_route);
    t.ruma::<r::tag::create_tag::v3::Request, _, _>(tags::create_tag_route);
    t.ruma::<r::tag::delete_tag::v3::Request, _, _>(tags::delete_tag_route);
    t.ruma::<r::filter::create_filter::v3::Request, _, _>(filters::create_filter_route);
    t.ruma::<r::filter::get_filter::v3::Request, _, _>(filters::get_filter_route);
    t.ruma::<r::push::get_pushrules_all::v3::Request, _, _>(push_rules::get_pushrules_all_route);
    t.ruma::<r::push::get_pushers::v3::Request, _, _>(pushers::get_pushers_route);
    t.ruma::<r::push::set_pusher::v3::Request, _, _>(pushers::set_pusher_route);
    t.ruma::<r::push::get_notifications::v3::Request, _, _>(notifications::get_notifications_route);
    t.ruma::<r::push::get_pushrules_global_scope::v3::Request, _, _>(
        push_rules::get_pushrules_global_route,
    );
    t.ruma::<r::push::get_pushrule::v3::Request, _, _>(push_rules::get_pushrule_route);
    t.ruma::<r::push::set_pushrule::v3::Request, _, _>(push_rules::set_pushrule_route);
    t.ruma::<r::push::delete_pushrule::v3::Request, _, _>(push_rules::delete_pushrule_route);
    t.ruma::<r::push::get_pushrule_enabled::v3::Request, _, _>(
        push_rules::get_pushrule_enabled_route,
    );
    t.ruma::<r::push::set_pushrule_enabled::v3::Request, _, _>(
        push_rules::set_pushrule_enabled_route,
    );
    t.ruma::<r::push::get_pushrule_actions::v3::Request, _, _>(
        push_rules::get_pushrule_actions_route,
    );
    t.ruma::<r::push::set_pushrule_actions::v3::Request, _, _>(
        push_rules::set_pushrule_actions_route,
    );

    t.ruma::<r::room::create_room::v3::Request, _, _>(rooms::create_room_route);
    t.ruma::<r::membership::join_room_by_id_or_alias::v3::Request, _, _>(
        rooms::join_by_id_or_alias_route,
    );
    t.ruma::<r::membership::join_room_by_id::v3::Request, _, _>(rooms::join_by_id_route);
    t.ruma::<r::knock::knock_room::v3::Request, _, _>(rooms::knock_route);
    t.ruma::<r::membership::leave_room::v3::Request, _, _>(rooms::leave_route);
    t.ruma::<r::membership::invite_user::v3::Request, _, _>(rooms::invite_route);
    t.ruma::<r::membership::kick_user::v3::Request, _, _>(rooms::kick_route);
    t.ruma::<r::membership::ban_user::v3::Request, _, _>(rooms::ban_route);
    t.ruma::<r::membership::unban_user::v3::Request, _, _>(rooms::unban_route);
    t.ruma::<r::membership::forget_room::v3::Request, _, _>(rooms::forget_route);
    t.ruma::<r::membership::joined_rooms::v3::Request, _, _>(rooms::joined_rooms_route);
    t.ruma::<r::membership::joined_members::v3::Request, _, _>(rooms::joined_members_route);
    t.ruma::<r::membership::get_member_events::v3::Request, _, _>(rooms::members_route);
    t.ruma::<r::room::upgrade_room::v3::Request, _, _>(rooms::upgrade_route);

    t.long_polls(|t| {
        t.ruma::<r::sync::sync_events::v3::Request, _, _>(sync::sync_route);
        for path in [sliding_sync::UNSTABLE_PATH, sliding_sync::STABLE_PATH] {
            t.raw(Method::POST, path, sliding_sync::sliding_sync_route);
        }
    });
    t.ruma::<r::message::get_message_events::v3::Request, _, _>(sync::messages_route);
    t.ruma::<r::message::send_message_event::v3::Request, _, _>(events::send_message_route);
    t.ruma::<r::receipt::create_receipt::v3::Request, _, _>(receipts::create_receipt_route);
    t.ruma::<r::read_marker::set_read_marker::v3::Request, _, _>(receipts::read_markers_route);
    t.ruma::<r::typing::create_typing_event::v3::Request, _, _>(typing::typing_route);
    t.ruma::<r::presence::set_presence::v3::Request, _, _>(presence::set_presence_route);
    t.ruma::<r::presence::get_presence::v3::Request, _, _>(presence::get_presence_route);
    t.ruma::<r::state::send_state_event::v3::Request, _, _>(events::send_state_route);
    t.ruma::<r::state::get_state_events::v3::Request, _, _>(events::get_state_route);
    t.ruma::<r::state::get_state_event_for_key::v3::Request, _, _>(events::get_state_event_route);
    t.ruma::<r::redact::redact_event::v3::Request, _, _>(events::redact_route);
    t.ruma::<r::room::get_room_event::v3::Request, _, _>(events::get_event_route);
    t.ruma::<r::context::get_context::v3::Request, _, _>(events::context_route);
    t.ruma::<r::relations::get_relating_events::v1::Request, _, _>(relations::relations_route);
    t.ruma::<r::relations::get_relating_events_with_rel_type::v1::Request, _, _>(
        relations::relations_by_type_route,
    );
    t.ruma::<r::relations::get_relating_events_with_rel_type_and_event_type::v1::Request, _, _>(
        relations::relations_by_type_and_event_type_route,
    );
    t.ruma::<r::threads::get_threads::v1::Request, _, _>(relations::threads_route);
    t.ruma::<r::search::search_events::v3::Request, _, _>(search::search_route);
    t.ruma::<r::room::get_event_by_timestamp::v1::Request, _, _>(events::timestamp_to_event_route);

    t.ruma::<r::keys::upload_keys::v3::Request, _, _>(keys::upload_keys_route);
    t.ruma::<r::keys::get_keys::v3::Request, _, _>(keys::query_keys_route);
    t.ruma::<r::keys::claim_keys::v3::Request, _, _>(keys::claim_keys_route);
    t.ruma::<r::keys::get_key_changes::v3::Request, _, _>(keys::key_changes_route);
    t.ruma::<r::keys::upload_signing_keys::v3::Request, _, _>(keys::upload_signing_keys_route);
    t.ruma::<r::keys::upload_signatures::v3::Request, _, _>(keys::upload_signatures_route);
    t.ruma::<r::to_device::send_event_to_device::v3::Request, _, _>(keys::send_to_device_route);
    t.ruma::<r::backup::create_backup_version::v3::Request, _, _>(backup::create_version_route);
    t.ruma::<r::backup::get_latest_backup_info::v3::Request, _, _>(
        backup::get_latest_version_route,
    );
    t.ruma::<r::backup::get_backup_info::v3::Request, _, _>(backup::get_version_route);
    t.ruma::<r::backup::update_backup_version::v3::Request, _, _>(backup::update_version_route);
    t.ruma::<r::backup::delete_backup_version::v3::Request, _, _>(backup::delete_version_route);
    t.ruma::<r::backup::add_backup_keys::v3::Request, _, _>(backup::put_keys_route);
    t.ruma::<r::backup::add_backup_keys_for_room::v3::Request, _, _>(backup::put_room_keys_route);
    t.ruma::<r::backup::add_backup_keys_for_session::v3::Request, _, _>(
        backup::put_session_key_route,
    );
    t.ruma::<r::backup::get_backup_keys::v3::Request, _, _>(backup::get_keys_route);
    t.ruma::<r::backup::get_backup_keys_for_room::v3::Request, _, _>(backup::get_room_keys_route);
    t.ruma::<r::backup::get_backup_keys_for_session::v3::Request, _, _>(
        backup::get_session_key_route,
    );
    t.ruma::<r::backup::delete_backup_keys::v3::Request, _, _>(backup::delete_keys_route);
    t.ruma::<r::backup::delete_backup_keys_for_room::v3::Request, _, _>(
        backup::delete_room_keys_route,
    );
    t.ruma::<r::backup::delete_backup_keys_for_session::v3::Request, _, _>(
        backup::delete_session_key_route,
    );

    media_routes(t);
    unstable_routes(t);
    for version in ["v3", "r0"] {
        t.raw(
            Method::GET,
            &format!("/_matrix/client/{version}/voip/turnServer"),
            voip::turn_server_route,
        );
    }

    t.ruma::<r::alias::create_alias::v3::Request, _, _>(directory::create_alias_route);
    t.ruma::<r::alias::get_alias::v3::Request, _, _>(directory::get_alias_route);
    t.ruma::<r::alias::delete_alias::v3::Request, _, _>(directory::delete_alias_route);
    t.ruma::<r::room::aliases::v3::Request, _, _>(directory::room_aliases_route);
    t.ruma::<r::directory::get_room_visibility::v3::Request, _, _>(directory::get_visibility_route);
    t.ruma::<r::directory::set_room_visibility::v3::Request, _, _>(directory::set_visibility_route);
    t.ruma::<r::directory::get_public_rooms::v3::Request, _, _>(directory::public_rooms_route);
    t.ruma::<r::directory::get_public_rooms_filtered::v3::Request, _, _>(
        directory::public_rooms_filtered_route,
    );
    t.ruma::<r::user_directory::search_users::v3::Request, _, _>(directory::search_users_route);

    spaces_and_reports_routes(t);
    admin::routes(t);
}

/// Spaces, room previews, reports and the lookups clients make at start.
fn spaces_and_reports_routes(t: &mut RouteTable) {
    use ::ruma::api::client as r;
    use client::{lookups, reports, spaces, thirdparty};

    t.ruma::<r::space::get_hierarchy::v1::Request, _, _>(spaces::hierarchy_route);
    t.ruma::<r::room::get_summary::v1::Request, _, _>(spaces::room_summary_route);
    // MSC3266's unstable paths, which clients still call (the second is Synapse's).
    for path in [
        "/_matrix/client/unstable/im.nheko.summary/rooms/{room_id_or_alias}/summary",
        "/_matrix/client/unstable/im.nheko.summary/summary/{room_id_or_alias}",
    ] {
        t.raw(Method::GET, path, spaces::room_summary_route);
    }
    for path in <r::room::report_content::v3::Request as ::ruma::api::Metadata>::PATH_BUILDER
        .all_paths()
        .filter(|p| !p.contains("/unstable/"))
    {
        t.raw(Method::POST, path, reports::report_event_route);
    }
    t.ruma::<r::room::report_room::v3::Request, _, _>(reports::report_room_route);
    t.ruma::<r::reporting::report_user::v3::Request, _, _>(reports::report_user_route);
    t.ruma::<r::account::get_3pids::v3::Request, _, _>(lookups::get_3pids_route);
    t.ruma::<r::thirdparty::get_protocols::v3::Request, _, _>(thirdparty::get_protocols_route);
    t.ruma::<r::thirdparty::get_protocol::v3::Request, _, _>(thirdparty::get_protocol_route);
    t.ruma::<r::thirdparty::get_location_for_protocol::v3::Request, _, _>(
        thirdparty::get_location_for_protocol_route,
    );
    t.ruma::<r::thirdparty::get_user_for_protocol::v3::Request, _, _>(
        thirdparty::get_user_for_protocol_route,
    );
    t.ruma::<r::thirdparty::get_location_for_room_alias::v3::Request, _, _>(
        thirdparty::get_location_for_alias_route,
    );
    t.ruma::<r::thirdparty::get_user_for_user_id::v3::Request, _, _>(
        thirdparty::get_user_for_user_id_route,
    );
    // `/auth_metadata` is deliberately not routed: its 404 `M_UNRECOGNIZED` is the spec's
    // answer of a server without the OAuth 2.0 API (Synapse without MAS does the same).
}

/// Routes of unstable features clients use (MSC4140 delayed events, MSC3814 dehydrated
/// devices), at the unstable paths Synapse serves them on.
fn unstable_routes(t: &mut RouteTable) {
    use client::{dehydrated_devices as dehydrated, delayed_events as delayed};

    let delayed_events = "/_matrix/client/unstable/org.matrix.msc4140/delayed_events";
    t.raw(Method::GET, delayed_events, delayed::list_route);
    let one = format!("{delayed_events}/{{delay_id}}");
    t.raw(Method::GET, &one, delayed::get_route);
    t.raw(Method::POST, &one, delayed::update_route);
    t.raw(
        Method::POST,
        &format!("{one}/cancel"),
        delayed::cancel_route,
    );
    t.raw(
        Method::POST,
        &format!("{one}/restart"),
        delayed::restart_route,
    );
    t.raw(Method::POST, &format!("{one}/send"), delayed::send_route);

    let dehydrated_device = "/_matrix/client/unstable/org.matrix.msc3814.v1/dehydrated_device";
    t.raw(Method::GET, dehydrated_device, dehydrated::get_route);
    t.raw(Method::PUT, dehydrated_device, dehydrated::put_route);
    t.raw(Method::DELETE, dehydrated_device, dehydrated::delete_route);
    let events = format!("{dehydrated_device}/{{device_id}}/events");
    t.raw(Method::GET, &events, dehydrated::get_events_route);
    t.raw(Method::POST, &events, dehydrated::post_events_route);
}

/// The media routes, the deprecated unauthenticated ones included (they serve media from
/// before the configured freeze only).
#[allow(deprecated)]
fn media_routes(t: &mut RouteTable) {
    use ::ruma::api::client as r;
    use client::media;

    for version in ["v3", "r0"] {
        let upload = format!("/_matrix/media/{version}/upload");
        t.raw(Method::POST, &upload, media::upload_route);
        t.raw(
            Method::PUT,
            &format!("{upload}/{{server_name}}/{{media_id}}"),
            media::upload_pending_route,
        );
    }
    t.ruma::<r::media::create_mxc_uri::v1::Request, _, _>(media::create_route);
    t.ruma::<r::authenticated_media::get_media_config::v1::Request, _, _>(media::config_route);
    t.ruma::<r::authenticated_media::get_media_preview::v1::Request, _, _>(media::preview_route);
    t.ruma::<r::authenticated_media::get_content::v1::Request, _, _>(media::download_route);
    t.ruma::<r::authenticated_media::get_content_as_filename::v1::Request, _, _>(
        media::download_named_route,
    );
    t.ruma::<r::authenticated_media::get_content_thumbnail::v1::Request, _, _>(
        media::thumbnail_route,
    );
    t.ruma::<r::media::get_media_config::v3::Request, _, _>(media::legacy_config_route);
    t.ruma::<r::media::get_media_preview::v3::Request, _, _>(media::legacy_preview_route);
    t.ruma::<r::media::get_content::v3::Request, _, _>(media::legacy_download_route);
    t.ruma::<r::media::get_content_as_filename::v3::Request, _, _>(
        media::legacy_download_named_route,
    );
    t.ruma::<r::media::get_content_thumbnail::v3::Request, _, _>(media::legacy_thumbnail_route);
}

/// Registers every route on an actix app; the federation routes only when federation is on
/// (otherwise their paths answer 404 `M_UNRECOGNIZED` like any unknown path).
pub fn configure(cfg: &mut web::ServiceConfig, federation: bool) {
    let mut table = RouteTable {
        build_handlers: true,
        ..Default::default()
    };
    routes(&mut table);
    if federation {
        federation::routes(&mut table);
    }
    table.register(cfg);
}

/// Every `(method, path)` the server serves (for the api-spec check).
pub fn served_routes() -> Vec<(String, String)> {
    let mut table = RouteTable::default();
    routes(&mut table);
    federation::routes(&mut table);
    table.list()
}

#[cfg(test)]
mod tests {
    use actix_web::{test, App};

    use super::*;

    /// The route a path should reach: of the templates whose segments match it, the one with
    /// a literal at the first segment where they differ (what actix's first match gives over
    /// routes in sorted order, literals before parameters).
    fn most_specific<'a>(templates: &'a [String], path: &str) -> Option<&'a str> {
        let segments: Vec<&str> = path.split('/').collect();
        let matching = templates.iter().filter(|template| {
            let pattern: Vec<&str> = template.split('/').collect();
            pattern.len() == segments.len()
                && pattern
                    .iter()
                    .zip(&segments)
                    .all(|(p, s)| p == s || (p.starts_with('{') && !s.is_empty()))
        });
        let rank = |template: &str| -> Vec<bool> {
            template.split('/').map(|p| p.starts_with('{')).collect()
        };
        matching.min_by_key(|t| rank(t)).map(String::as_str)
    }

    /// Paths for a template: every parameter `x`, and each parameter in turn one of the
    /// literals other templates have at that segment (where a nested scope could capture it).
    fn concrete_paths(template: &str, templates: &[String]) -> Vec<String> {
        let pattern: Vec<&str> = template.split('/').collect();
        let fill = |at: Option<(usize, &str)>| -> String {
            let segments: Vec<&str> = pattern
                .iter()
                .enumerate()
                .map(|(i, p)| match (p.starts_with('{'), at) {
                    (true, Some((j, literal))) if i == j => literal,
                    (true, _) => "x",
                    (false, _) => p,
                })
                .collect();
            segments.join("/")
        };
        let mut paths = vec![fill(None)];
        let parameters = (0..pattern.len()).filter(|&i| pattern[i].starts_with('{'));
        for i in parameters {
            for other in templates {
                if let Some(literal) = other
                    .split('/')
                    .nth(i)
                    .filter(|s| !s.is_empty() && !s.starts_with('{'))
                {
                    paths.push(fill(Some((i, literal))));
                }
            }
        }
        paths.sort();
        paths.dedup();
        paths
    }

    /// Serves `served` through [`RouteTable::register`], each route answering its method and
    /// template, and checks that each path [`concrete_paths`] makes reaches [`most_specific`].
    async fn assert_routed_as_a_flat_list_would(served: &[(String, String)]) {
        let mut table = RouteTable {
            build_handlers: true,
            ..Default::default()
        };
        for (method, template) in served {
            let answer = format!("{method} {template}");
            table.raw(
                Method::from_bytes(method.as_bytes()).unwrap(),
                template,
                move || {
                    let answer = answer.clone();
                    async move { answer }
                },
            );
        }
        let app = test::init_service(App::new().configure(|cfg| table.register(cfg))).await;
        let mut templates: Vec<String> = served.iter().map(|(_, t)| t.clone()).collect();
        templates.sort();
        templates.dedup();
        let mut checked = 0;
        for (method, template) in served {
            for path in concrete_paths(template, &templates) {
                let expected = most_specific(&templates, &path)
                    .unwrap_or_else(|| panic!("{template}: {path}"));
                if !served.contains(&(method.clone(), expected.to_owned())) {
                    continue;
                }
                let request = test::TestRequest::default()
                    .method(Method::from_bytes(method.as_bytes()).unwrap())
                    .uri(&path)
                    .to_request();
                let response = test::call_service(&app, request).await;
                let body = test::read_body(response).await;
                assert_eq!(
                    String::from_utf8_lossy(&body),
                    format!("{method} {expected}"),
                    "{method} {path}"
                );
                checked += 1;
            }
        }
        assert!(checked > served.len(), "only {checked} paths checked");
    }

    #[actix_web::test]
    async fn the_scope_tree_routes_every_served_path_where_a_flat_list_would() {
        assert_routed_as_a_flat_list_would(&served_routes()).await;
    }

    /// Levels where a literal and a parameter (or two parameters) are siblings, which the
    /// served table may not have today: no scope may capture a path meant for a sibling.
    #[actix_web::test]
    async fn sibling_literals_and_parameters_keep_their_own_routes() {
        let served: Vec<(String, String)> = [
            "/a/global/one",
            "/a/global/two/{rule}",
            "/a/{scope}/b",
            "/a/{scope}/c/{x}",
            "/a/{other}/d",
            "/a/{other}/e/f",
            "/p/{one}/q",
            "/p/{one}/r",
            "/p/{two}/s",
            "/p/{two}/t",
            "/p/u/v",
            "/p/u/w",
        ]
        .iter()
        .map(|t| ("GET".to_owned(), (*t).to_owned()))
        .collect();
        assert_routed_as_a_flat_list_would(&served).await;
    }
}
