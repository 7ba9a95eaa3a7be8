//! HTTP layer: the route table, middleware and handlers. Handlers are thin: they take the
//! caller from the extractor, call services and build the response.

pub mod admin;
pub mod client;
pub mod middleware;
pub mod ruma;

use std::collections::BTreeMap;

use actix_web::{
    http::{Method, StatusCode},
    web, FromRequest, Handler, HttpResponse, Responder, Route,
};
use ::ruma::api::{path_builder::PathBuilder, IncomingRequest};

use crate::error::Error;

/// Collects routes, grouped by path so a known path with the wrong method gets 405.
#[derive(Default)]
pub struct RouteTable {
    routes: BTreeMap<String, Vec<(Method, Option<Route>)>>,
    build_handlers: bool,
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
        let method = Method::from_bytes(R::METHOD.as_str().as_bytes()).expect("ruma methods are valid");
        for path in R::PATH_BUILDER.all_paths().filter(|p| !p.contains("/unstable/")) {
            self.raw(method.clone(), path, handler.clone());
        }
        self
    }

    /// Registers a handler for one method and path.
    pub fn raw<F, Args>(&mut self, method: Method, path: &str, handler: F) -> &mut Self
    where
        F: Handler<Args>,
        Args: FromRequest + 'static,
        F::Output: Responder + 'static,
    {
        let route = self.build_handlers.then(|| web::method(method.clone()).to(handler));
        self.routes.entry(path.to_owned()).or_default().push((method, route));
        self
    }

    /// Every `(method, path)` served, sorted.
    pub fn list(&self) -> Vec<(String, String)> {
        let mut list: Vec<_> = self
            .routes
            .iter()
            .flat_map(|(path, methods)| methods.iter().map(move |(m, _)| (m.to_string(), path.clone())))
            .collect();
        list.sort();
        list
    }

    fn register(self, cfg: &mut web::ServiceConfig) {
        for (path, methods) in self.routes {
            let mut resource = web::resource(path).default_service(web::to(method_not_allowed));
            for (_, route) in methods {
                resource = resource.route(route.expect("handlers are built for registration"));
            }
            cfg.service(resource);
        }
    }
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

    t.raw(Method::GET, "/.well-known/matrix/client", discovery::well_known_client_route);
    t.raw(Method::GET, "/.well-known/matrix/server", discovery::well_known_server_route);
    t.ruma::<r::discovery::get_supported_versions::Request, _, _>(discovery::versions_route);
    t.ruma::<r::discovery::get_capabilities::v3::Request, _, _>(discovery::capabilities_route);

    t.ruma::<r::account::register::v3::Request, _, _>(register::register_route);
    t.ruma::<r::account::get_username_availability::v3::Request, _, _>(register::username_available_route);
    t.ruma::<r::account::check_registration_token_validity::v1::Request, _, _>(register::token_validity_route);

    t.ruma::<r::session::get_login_types::v3::Request, _, _>(session::get_login_types_route);
    t.ruma::<r::session::login::v3::Request, _, _>(session::login_route);
    t.ruma::<r::session::logout::v3::Request, _, _>(session::logout_route);
    t.ruma::<r::session::logout_all::v3::Request, _, _>(session::logout_all_route);
    t.ruma::<r::session::refresh_token::v3::Request, _, _>(session::refresh_route);
    t.ruma::<r::account::whoami::v3::Request, _, _>(account::whoami_route);

    t.ruma::<r::account::change_password::v3::Request, _, _>(account::change_password_route);
    t.ruma::<r::account::deactivate::v3::Request, _, _>(account::deactivate_route);

    t.ruma::<r::profile::get_profile::v3::Request, _, _>(profile::get_profile_route);
    t.ruma::<r::profile::get_profile_field::v3::Request, _, _>(profile::get_profile_field_route);
    t.ruma::<r::profile::set_profile_field::v3::Request, _, _>(profile::set_profile_field_route);
    t.ruma::<r::profile::delete_profile_field::v3::Request, _, _>(profile::delete_profile_field_route);

    t.ruma::<r::device::get_devices::v3::Request, _, _>(devices::get_devices_route);
    t.ruma::<r::device::get_device::v3::Request, _, _>(devices::get_device_route);
    t.ruma::<r::device::update_device::v3::Request, _, _>(devices::update_device_route);
    t.ruma::<r::device::delete_device::v3::Request, _, _>(devices::delete_device_route);
    t.ruma::<r::device::delete_devices::v3::Request, _, _>(devices::delete_devices_route);

    t.ruma::<r::config::get_global_account_data::v3::Request, _, _>(account_data::get_global_route);
    t.ruma::<r::config::set_global_account_data::v3::Request, _, _>(account_data::set_global_route);
    t.ruma::<r::config::get_room_account_data::v3::Request, _, _>(account_data::get_room_route);
    t.ruma::<r::config::set_room_account_data::v3::Request, _, _>(account_data::set_room_route);
    t.ruma::<r::filter::create_filter::v3::Request, _, _>(filters::create_filter_route);
    t.ruma::<r::filter::get_filter::v3::Request, _, _>(filters::get_filter_route);
    t.ruma::<r::push::get_pushrules_all::v3::Request, _, _>(push_rules::get_pushrules_all_route);

    admin::routes(t);
}

/// Registers every route on an actix app.
pub fn configure(cfg: &mut web::ServiceConfig) {
    let mut table = RouteTable { build_handlers: true, ..Default::default() };
    routes(&mut table);
    table.register(cfg);
}

/// Every `(method, path)` the server serves (for the api-spec check).
pub fn served_routes() -> Vec<(String, String)> {
    let mut table = RouteTable::default();
    routes(&mut table);
    table.list()
}
