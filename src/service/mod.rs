//! Domain logic. Handlers call services; services call storage.

pub mod account_data;
pub mod admin;
pub mod appservice;
pub mod consistency;
pub mod dehydrated_devices;
pub mod delayed_events;
pub mod e2ee;
pub mod federation;
pub mod gauges;
pub mod health;
pub mod keys;
pub mod media;
pub mod notifier;
pub mod outbound;
pub mod passwords;
pub mod presence;
pub mod push_rules;
pub mod push_sender;
pub mod pushers;
pub mod rate_limit;
pub mod registration_tokens;
pub mod reports;
pub mod rooms;
pub mod sending;
pub mod sessions;
pub mod spaces;
pub mod statistics;
pub mod sync;
pub mod typing;
pub mod uia;
pub mod url_preview;
pub mod users;
pub mod voip;

use std::sync::Arc;

use crate::{config::Config, storage::Db};

/// Every service, built once at start and shared by all requests.
pub struct Services {
    /// The validated configuration.
    pub config: Arc<Config>,
    /// The database pool.
    pub db: Db,
    /// Access tokens, refresh tokens and the token cache.
    pub sessions: Arc<sessions::Sessions>,
    /// Accounts, devices, profiles and login.
    pub users: users::Users,
    /// User-interactive authentication.
    pub uia: uia::Uia,
    /// Request rate limits.
    pub rate_limit: Arc<rate_limit::RateLimiter>,
    /// Account data and filters.
    pub account_data: account_data::AccountData,
    /// The Synapse-compatible admin API.
    pub admin: admin::Admin,
    /// Registration tokens (admin-managed).
    pub registration_tokens: registration_tokens::RegistrationTokens,
    /// Reports of events, rooms and users.
    pub reports: reports::Reports,
    /// The server's signing key.
    pub keys: Arc<keys::ServerKeys>,
    /// Rooms, events, state and membership.
    pub rooms: rooms::Rooms,
    /// Long-poll wake-ups.
    pub notifier: Arc<notifier::Notifier>,
    /// Readiness (`/readyz`).
    pub health: health::Health,
    /// `/sync`.
    pub sync: sync::Sync,
    /// Users' push rules.
    pub push_rules: push_rules::PushRules,
    /// Users' pushers.
    pub pushers: pushers::Pushers,
    /// Presence.
    pub presence: Arc<presence::Presence>,
    /// Device, one-time and cross-signing keys.
    pub e2ee_keys: e2ee::keys::Keys,
    /// To-device messages.
    pub to_device: e2ee::to_device::ToDevice,
    /// Server-side key backup.
    pub backup: e2ee::backup::Backup,
    /// The media repository.
    pub media: media::Media,
    /// The HTTP client for requests to other hosts.
    pub outbound: Arc<outbound::Outbound>,
    /// Delivers pushes to gateways (started by `serve`).
    pub push_sender: Arc<push_sender::PushSender>,
    /// The Server-Server API: signed requests out, authentication of requests in.
    pub federation: Arc<federation::Federation>,
    /// Delayed events (MSC4140) and their timer (started by `serve`).
    pub delayed_events: delayed_events::DelayedEvents,
    /// Dehydrated devices (MSC3814).
    pub dehydrated_devices: dehydrated_devices::DehydratedDevices,
    /// URL previews.
    pub url_previews: url_preview::UrlPreviews,
    /// Application services: registrations, identity assertion, ping.
    pub appservices: appservice::Appservices,
    /// Delivers transactions to application services (started by `serve`).
    pub appservice_sender: Arc<appservice::sender::AppserviceSender>,
}

impl Services {
    /// Creates each appservice's own user (its `sender_localpart`) if it does not exist yet,
    /// as Synapse does: bridges act as it from their first request.
    pub async fn register_appservice_senders(&self) -> crate::error::Result<()> {
        for registration in self.appservices.all() {
            match self
                .users
                .register(&registration.sender, None, false, None, None)
                .await
            {
                Ok(_) => {
                    tracing::info!(user = %registration.sender, "created the appservice's user")
                }
                Err(err) if err.errcode() == "M_USER_IN_USE" => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Builds the services over a database pool (loading or creating the signing key).
    pub async fn new(config: Config, db: Db) -> crate::error::Result<Arc<Self>> {
        let config = Arc::new(config);
        let keys = Arc::new(keys::ServerKeys::load_or_create(&db).await?);
        let sessions = Arc::new(sessions::Sessions::new(db.clone(), config.clone()));
        let notifier = notifier::Notifier::new(db.clone(), sessions.clone());
        let appservice_urls: Vec<&str> = config
            .appservices
            .iter()
            .filter_map(|r| r.url.as_deref())
            .collect();
        let outbound = Arc::new(outbound::Outbound::new(
            config.outbound.clone(),
            &appservice_urls,
        ));
        let appservices =
            appservice::Appservices::new(db.clone(), outbound.clone(), &config.appservices);
        let push_sender =
            push_sender::PushSender::new(db.clone(), outbound.clone(), notifier.push_wake.clone());
        let rate_limit = Arc::new(rate_limit::RateLimiter::new(&config));
        let federation = Arc::new(federation::Federation::new(
            db.clone(),
            config.clone(),
            keys.clone(),
            notifier.federation_wake.clone(),
        )?);
        let federation_sender = federation.sender.clone();
        let presence = presence::Presence::new(
            db.clone(),
            config.presence_enabled,
            federation_sender.clone(),
        );
        let appservice_sender = appservice::sender::AppserviceSender::new(
            db.clone(),
            outbound.clone(),
            notifier.clone(),
            presence.clone(),
            appservices.all(),
        );
        let federation_client = federation.client.clone();
        let media_fetcher = federation.client.clone();
        let delayed_events = delayed_events::DelayedEvents::new(
            db.clone(),
            config.clone(),
            notifier.delayed_wake.clone(),
        );
        let dehydrated_devices =
            dehydrated_devices::DehydratedDevices::new(db.clone(), federation_sender.clone());
        let url_previews = url_preview::UrlPreviews::new(config.url_previews, outbound.clone());
        Ok(Arc::new(Services {
            appservices,
            appservice_sender,
            url_previews,
            delayed_events,
            dehydrated_devices,
            federation,
            health: health::Health::new(db.clone(), notifier.clone()),
            sync: sync::Sync::new(db.clone(), notifier.clone(), presence.clone()),
            notifier,
            rooms: rooms::Rooms::new(
                db.clone(),
                config.clone(),
                keys.clone(),
                federation_sender.clone(),
                rate_limit.clone(),
            ),
            keys,
            users: users::Users::new(
                db.clone(),
                config.clone(),
                sessions.clone(),
                federation_sender.clone(),
            ),
            uia: uia::Uia::new(db.clone(), config.clone(), rate_limit.clone()),
            rate_limit,
            account_data: account_data::AccountData::new(db.clone()),
            admin: admin::Admin::new(db.clone(), config.clone()),
            registration_tokens: registration_tokens::RegistrationTokens::new(db.clone()),
            reports: reports::Reports::new(db.clone(), config.server_name.clone()),
            push_rules: push_rules::PushRules::new(db.clone()),
            pushers: pushers::Pushers::new(db.clone(), outbound.clone()),
            e2ee_keys: e2ee::keys::Keys::new(
                db.clone(),
                federation_client,
                federation_sender.clone(),
            ),
            to_device: e2ee::to_device::ToDevice::new(
                db.clone(),
                config.server_name.clone(),
                federation_sender,
            ),
            backup: e2ee::backup::Backup::new(db.clone()),
            media: media::Media::new(db.clone(), config.clone(), media_fetcher),
            presence,
            push_sender,
            outbound,
            sessions,
            config,
            db,
        }))
    }
}
