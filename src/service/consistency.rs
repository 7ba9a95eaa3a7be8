//! The consistency sampler (`MYELIN_CONSISTENCY_SAMPLE_MINUTES`): every so often it recomputes
//! a few random users' unread counts (their push actions, from events, memberships and push
//! rules) and a few rooms' entries in the in-memory room-change index (from the events
//! table), compares them with what the server maintains, and counts the result in
//! `myelin_consistency_checks_total`. Each mismatch is logged. The counter is the running
//! proof that derived state equals what the facts say (DESIGN.md, invariant 6); the repair is
//! `myelin check-unread --fix`.

use std::{sync::Arc, time::Duration};

use ruma::UserId;

use super::Services;
use crate::{
    error::Result,
    metrics::{metrics, CheckLabels},
    storage::consistency as store,
};

/// Users whose unread counts one run recomputes.
const USERS_PER_RUN: i64 = 5;
/// Rooms of the room-change index one run checks.
const ROOMS_PER_RUN: usize = 20;

fn count(check: &'static str, ok: bool, n: usize) {
    let result = if ok { "ok" } else { "mismatch" };
    metrics()
        .consistency_checks
        .get_or_create(&CheckLabels { check, result })
        .inc_by(n as u64);
}

/// Starts the sampler: a first run after one interval, then one per interval.
pub fn start(services: Arc<Services>, every: Duration) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(err) = sample_once(&services).await {
                tracing::warn!("consistency sampler: {err}");
            }
        }
    });
}

/// One run: a few users' unread counts and a few rooms of the room-change index.
pub async fn sample_once(services: &Services) -> Result<()> {
    let users = {
        let conn = services.db.conn().await?;
        store::get_random_joined_users(&conn, USERS_PER_RUN).await?
    };
    for user in users {
        let Ok(user_id) = UserId::parse(user.as_str()) else {
            continue;
        };
        for (room, report) in services.rooms.check_unread(&user_id, None, false).await? {
            count("unread_counts", report.is_consistent(), 1);
            if !report.is_consistent() {
                tracing::warn!(
                    user = %user_id,
                    %room,
                    missing = report.missing.len(),
                    unexpected = report.unexpected.len(),
                    "consistency sampler: stored push actions differ from the recomputed \
                     ones (repair: myelin check-unread --fix)"
                );
            }
        }
    }
    let (agreed, mismatches) = services.sync.check_room_index(ROOMS_PER_RUN).await?;
    count("room_index", true, agreed);
    count("room_index", false, mismatches.len());
    for mismatch in mismatches {
        tracing::warn!("consistency sampler: room-change index differs: {mismatch}");
    }
    Ok(())
}
