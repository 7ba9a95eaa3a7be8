//! Wake-ups for long-polling `/sync` requests.
//!
//! Writers send `NOTIFY` once their transaction has committed (`storage::transaction`): `myelin_room` with a
//! room ID, `myelin_user` with a user ID. Revoked tokens are announced on `myelin_token` so
//! every process drops them from its token cache. Every server process LISTENs and wakes the waiting
//! syncs of the users concerned, so a sync served by one process sees writes made through
//! another. Wake-ups only say "look again": what a sync returns is always read from the
//! database, so a lost notification delays a response but never loses an event.
//!
//! Whom a room's events wake is kept per room between events (a room of 20,000 members was
//! read whole for every message), and kept current by the membership changes a trigger
//! announces on `myelin_members` ([`audience`]); while notifications are not being received,
//! it is read every time.

mod audience;

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, LazyLock, Mutex,
    },
    time::{Duration, Instant},
};

use futures_util::{stream, StreamExt};
use tokio::sync::Notify;
use tokio_postgres::AsyncMessage;

use self::audience::{Announcement, RoomAudiences, Snapshot, AUDIENCE};
use super::{delayed_events::DELAYED_CHANNEL, sessions::Sessions, typing::Typing};
use crate::storage::{
    memberships::{self as store, MEMBERS_CHANNEL},
    push::PUSH_CHANNEL,
    Db,
};

/// Channel for room changes (payload: room ID).
pub const ROOM_CHANNEL: &str = "myelin_room";
/// Channel for per-user changes (payload: user ID).
pub const USER_CHANNEL: &str = "myelin_user";
/// Channel for revoked access tokens (payload: comma-separated hex SHA-256 hashes).
pub const TOKEN_CHANNEL: &str = "myelin_token";
/// Channel for typing changes (payload: [`super::typing::encode`]).
pub const TYPING_CHANNEL: &str = "myelin_typing";
/// Channel for changes everyone sharing a room with a user must see: presence, devices and
/// keys (payload: user ID).
pub const SHARERS_CHANNEL: &str = "myelin_sharers";
/// Channel for EDUs queued for other servers (payload: the destination), for the federation
/// sender.
pub const FEDERATION_CHANNEL: &str = "myelin_federation";
/// Channel telling the appservice sender that an appservice is back (a successful ping).
pub const APPSERVICE_CHANNEL: &str = "myelin_appservice";

/// What a notification's arrival time is counted from (an `Instant` as a number, so a waiter
/// keeps it in an atomic).
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// What one user's syncs wait on, and when the notification that last woke them arrived here:
/// the delivery metrics measure a wake-up from it.
#[derive(Default)]
pub struct Waiter {
    notify: Notify,
    /// Nanoseconds from [`EPOCH`] to the last waking notification's arrival (0: none yet).
    arrived_ns: AtomicU64,
}

impl Waiter {
    /// Resolves at the next wake-up (see [`Notify::notified`]).
    pub fn notified(&self) -> tokio::sync::futures::Notified<'_> {
        self.notify.notified()
    }

    /// When the notification that last woke these syncs arrived (a later one may have
    /// overwritten it by the time a sync resumes: then the wake-up measures shorter).
    pub fn last_arrival(&self) -> Option<Instant> {
        match self.arrived_ns.load(Ordering::Relaxed) {
            0 => None,
            ns => Some(*EPOCH + Duration::from_nanos(ns)),
        }
    }

    fn wake(&self, arrived: Instant) {
        let ns = arrived.saturating_duration_since(*EPOCH).as_nanos();
        self.arrived_ns.store(
            u64::try_from(ns).unwrap_or(u64::MAX).max(1),
            Ordering::Relaxed,
        );
        self.notify.notify_waiters();
    }
}

/// Per-user wake-up handles.
pub struct Notifier {
    db: Db,
    sessions: Arc<Sessions>,
    waiters: Mutex<HashMap<String, Arc<Waiter>>>,
    /// Whom each room's events wake, for the rooms woken lately.
    audiences: Mutex<RoomAudiences>,
    /// Who is typing where (kept in step through [`TYPING_CHANNEL`]).
    pub typing: Typing,
    /// Woken when push actions that notify were stored, for the push sender.
    pub push_wake: Arc<Notify>,
    /// Woken whenever something is queued for another server or an event is written that may
    /// go to one (in a room with another server's member), for the federation sender.
    pub federation_wake: Arc<Notify>,
    /// Wakes the appservice sender (room writes, typing).
    pub appservice_wake: Arc<Notify>,
    /// Woken when a delayed event is scheduled or restarted, for the delayed-event timer.
    pub delayed_wake: Arc<Notify>,
    /// Whether the LISTEN connection is up (readiness: without it no wake-up arrives from
    /// other processes).
    listening: AtomicBool,
    /// Turns true once when the process starts shutting down: parked syncs answer at once.
    shutdown: tokio::sync::watch::Sender<bool>,
}

impl Notifier {
    /// Creates the notifier (call [`Notifier::listen`] to receive notifications).
    pub fn new(db: Db, sessions: Arc<Sessions>) -> Arc<Self> {
        Arc::new(Notifier {
            db,
            sessions,
            waiters: Mutex::new(HashMap::new()),
            audiences: Mutex::default(),
            typing: Typing::default(),
            push_wake: Arc::default(),
            federation_wake: Arc::default(),
            appservice_wake: Arc::default(),
            delayed_wake: Arc::default(),
            listening: AtomicBool::new(false),
            shutdown: tokio::sync::watch::Sender::new(false),
        })
    }

    /// Whether notifications are being received (the LISTEN connection is up).
    pub fn is_listening(&self) -> bool {
        self.listening.load(Ordering::Relaxed)
    }

    /// Starts the shutdown: every parked sync answers now, and later ones do not wait.
    pub fn shut_down(&self) {
        self.shutdown.send_replace(true);
    }

    /// Says (and changes to) `true` once the process is shutting down.
    pub fn shutdown_signal(&self) -> tokio::sync::watch::Receiver<bool> {
        self.shutdown.subscribe()
    }

    /// The handle a user's syncs wait on.
    pub fn subscribe(&self, user_id: &str) -> Arc<Waiter> {
        let mut waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        if waiters.len() > 10_000 {
            waiters.retain(|_, waiter| Arc::strong_count(waiter) > 1);
        }
        waiters.entry(user_id.to_owned()).or_default().clone()
    }

    /// Wakes one user's waiting syncs for a notification that `arrived` at this process.
    fn wake_user(&self, user_id: &str, arrived: Instant) {
        self.wake_users([user_id], arrived);
    }

    /// Wakes the waiting syncs of each of `users`.
    fn wake_users<'u>(&self, users: impl IntoIterator<Item = &'u str>, arrived: Instant) {
        let waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        for user in users {
            if let Some(waiter) = waiters.get(user) {
                waiter.wake(arrived);
            }
        }
    }

    fn wake_all(&self, arrived: Instant) {
        let waiters = self.waiters.lock().unwrap_or_else(|e| e.into_inner());
        waiters.values().for_each(|waiter| waiter.wake(arrived));
    }

    /// Wakes the syncs of everyone joined to, invited to or knocking on a room ([`AUDIENCE`]):
    /// whom its events wake is kept from an earlier wake-up while notifications are being
    /// received (the membership changes they announce keep it current), read anew while they
    /// are not (a change could be missed).
    async fn wake_room(&self, room_id: &str, arrived: Instant) {
        let read = || async {
            let conn = self.db.conn().await?;
            let (users, snapshot) = store::get_room_audience(&conn, room_id, &AUDIENCE).await?;
            let snapshot = Snapshot::parse(&snapshot).ok_or_else(|| {
                crate::error::Error::internal(format!("unreadable snapshot {snapshot}"))
            })?;
            Ok::<_, crate::error::Error>((users, snapshot))
        };
        let woken = match self.is_listening() {
            false => read()
                .await
                .map(|(users, _)| self.wake_users(users.iter().map(String::as_str), arrived)),
            true => {
                let room = self.audiences().room(room_id);
                room.wake(read, |users| {
                    self.wake_users(users.iter().map(String::as_str), arrived)
                })
                .await
            }
        };
        if let Err(err) = woken {
            tracing::warn!("could not look up room members to wake: {err}");
            // Changes announced meanwhile were kept for the read: start again.
            self.audiences().forget(room_id);
            self.wake_all(arrived);
        }
    }

    fn audiences(&self) -> std::sync::MutexGuard<'_, RoomAudiences> {
        self.audiences.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wakes the user and everyone sharing a joined room with them (presence, device lists).
    async fn wake_room_sharers(&self, user_id: &str, arrived: Instant) {
        self.wake_user(user_id, arrived);
        let rooms = async {
            let conn = self.db.conn().await?;
            Ok::<_, crate::error::Error>(store::get_rooms_for_user(&conn, user_id, "join").await?)
        }
        .await;
        match rooms {
            Ok(rooms) => {
                for room in rooms {
                    self.wake_room(&room, arrived).await;
                }
            }
            Err(err) => {
                tracing::warn!("could not look up rooms to wake: {err}");
                self.wake_all(arrived);
            }
        }
    }

    /// Applies a typing change and wakes the room; typing with a timeout gets a timer that
    /// ends it (and wakes the room again) when it runs out.
    fn typing_changed(self: &Arc<Self>, payload: &str, arrived: Instant) {
        let Some((room_id, user_id, timeout)) = super::typing::decode(payload) else {
            tracing::warn!("malformed typing notification: {payload}");
            return;
        };
        let room_id = room_id.to_owned();
        if self.typing.apply(&room_id, user_id, timeout) {
            let notifier = self.clone();
            let room = room_id.clone();
            tokio::spawn(async move { notifier.wake_room(&room, arrived).await });
        }
        if let Some(timeout) = timeout {
            let notifier = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(timeout + Duration::from_millis(5)).await;
                if notifier.typing.expire(&room_id) {
                    notifier.wake_room(&room_id, Instant::now()).await;
                }
            });
        }
    }

    /// Listens for notifications until the process ends, reconnecting after failures.
    pub fn listen(self: &Arc<Self>, database_url: String) {
        let notifier = self.clone();
        tokio::spawn(async move {
            loop {
                let result = notifier.listen_once(&database_url).await;
                notifier.listening.store(false, Ordering::Relaxed);
                if let Err(err) = result {
                    tracing::warn!("notification listener: {err}; reconnecting");
                }
                // Anything may have happened while we were not listening.
                notifier.wake_all(Instant::now());
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    async fn listen_once(
        self: &Arc<Self>,
        database_url: &str,
    ) -> Result<(), tokio_postgres::Error> {
        let (client, mut connection) =
            tokio_postgres::connect(database_url, tokio_postgres::NoTls).await?;
        let (sender, mut receiver) = tokio::sync::mpsc::unbounded_channel();
        let pump = tokio::spawn(async move {
            let mut messages = stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) => {
                        // Stamped on arrival: a wake-up is measured from here.
                        let arrived = Instant::now();
                        if sender
                            .send((n.channel().to_owned(), n.payload().to_owned(), arrived))
                            .is_err()
                        {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(err) => return Err(err),
                }
            }
            Ok(())
        });
        client
            .batch_execute(&format!(
                "LISTEN {ROOM_CHANNEL}; LISTEN {USER_CHANNEL}; LISTEN {TOKEN_CHANNEL}; \
                 LISTEN {TYPING_CHANNEL}; LISTEN {SHARERS_CHANNEL}; LISTEN {FEDERATION_CHANNEL}; \
                 LISTEN {DELAYED_CHANNEL}; LISTEN {APPSERVICE_CHANNEL}; LISTEN {MEMBERS_CHANNEL}; \
                 LISTEN {PUSH_CHANNEL};"
            ))
            .await?;
        // Memberships may have changed unannounced while nothing was listening.
        self.audiences().clear();
        self.listening.store(true, Ordering::Relaxed);
        while let Some((channel, payload, arrived)) = receiver.recv().await {
            let notifier = self.clone();
            if channel == ROOM_CHANNEL {
                // Not the federation sender nor the push sender: the writes tell them of the
                // events they may have to send (a pass per event that has nothing for them
                // was a statement or a transaction per send).
                notifier.appservice_wake.notify_one();
                tokio::spawn(async move { notifier.wake_room(&payload, arrived).await });
            } else if channel == MEMBERS_CHANNEL {
                // Applied here, in commit order. The room's event of the same commit may have
                // been announced first and woken the audience from before it: wake a member
                // who is new to it too.
                match Announcement::parse(&payload) {
                    Announcement::Change(change) => {
                        if change.enters_audience() {
                            notifier.wake_user(&change.user, arrived);
                        }
                        notifier.audiences().change(change);
                    }
                    Announcement::Forget(room_id) => notifier.audiences().forget(&room_id),
                    Announcement::Unreadable => {
                        tracing::warn!("unreadable membership announcement: {payload}");
                        notifier.audiences().clear();
                    }
                }
            } else if channel == PUSH_CHANNEL {
                notifier.push_wake.notify_one();
            } else if channel == SHARERS_CHANNEL {
                // A device-list change: appservices may be sent it (MSC3202).
                notifier.appservice_wake.notify_one();
                tokio::spawn(async move { notifier.wake_room_sharers(&payload, arrived).await });
            } else if channel == TYPING_CHANNEL {
                notifier.typing_changed(&payload, arrived);
                notifier.appservice_wake.notify_one();
            } else if channel == FEDERATION_CHANNEL {
                notifier.federation_wake.notify_one();
            } else if channel == APPSERVICE_CHANNEL {
                notifier.appservice_wake.notify_one();
            } else if channel == DELAYED_CHANNEL {
                notifier.delayed_wake.notify_one();
            } else if channel == TOKEN_CHANNEL {
                let hashes: Vec<String> = payload.split(',').map(str::to_owned).collect();
                notifier.sessions.forget_cached_hex(&hashes);
            } else {
                // Perhaps a to-device message for an appservice's user.
                notifier.appservice_wake.notify_one();
                notifier.wake_user(&payload, arrived);
            }
        }
        match pump.await {
            Ok(result) => result,
            Err(_) => Ok(()),
        }
    }
}
