//! The long-poll waiter `/sync` and sliding sync share, and its metrics.

use std::{future::Future, time::Duration};

use super::{Computed, Sync};
use crate::{error::Result, metrics::Resumed, storage::streams};

/// Longest long-poll.
const MAX_TIMEOUT: Duration = Duration::from_secs(60);

/// How soon a sync that found nothing looks again while the positions taken when it read are
/// not all persisted; doubled each time up to [`HELD_BACK_RECHECK_MAX`].
const HELD_BACK_RECHECK_FIRST: std::time::Duration = std::time::Duration::from_millis(5);
const HELD_BACK_RECHECK_MAX: std::time::Duration = std::time::Duration::from_millis(500);

/// Where one sync's time went, for the metrics.
#[derive(Default)]
struct PollTiming {
    /// Computing responses.
    built: Duration,
    /// Parked, waiting for a wake-up or the timeout.
    waited: Duration,
    /// Whether it parked at all.
    parked: bool,
}

impl PollTiming {
    /// Runs one computation, adding its time to `built`.
    async fn build<T>(&mut self, computing: impl Future<Output = T>) -> T {
        let started = tokio::time::Instant::now();
        let computed = computing.await;
        self.built += started.elapsed();
        computed
    }

    /// Counts the finished sync.
    fn record(&self, api: &'static str, initial: bool) {
        let kind = match (initial, self.parked) {
            (true, _) => "initial",
            (false, false) => "incremental",
            (false, true) => "long_poll",
        };
        let metrics = crate::metrics::metrics();
        let labels = crate::metrics::SyncLabels { api, kind };
        metrics.sync_requests.get_or_create(&labels).inc();
        metrics
            .sync_build
            .get_or_create(&labels)
            .observe(self.built.as_secs_f64());
        if self.parked {
            metrics
                .sync_wait
                .get_or_create(&crate::metrics::ApiLabel { api })
                .observe(self.waited.as_secs_f64());
        }
    }
}

/// The positions a sync waits to see persisted before it trusts an empty read: those of its
/// first read after a wake-up (`fresh`) while some were held back, until a later read covers
/// them. Takes the read's positions, so that they are not kept while the sync is parked.
fn still_held_back(
    held: Option<streams::Positions>,
    read: streams::Positions,
    fresh: bool,
) -> Option<streams::Positions> {
    if fresh {
        read.held_back().then_some(read)
    } else {
        held.filter(|taken| !read.covers(taken))
    }
}

impl Sync {
    /// Computes a response, and while it is empty (and `at_once` is false) computes it again
    /// whenever something of the user's changes, until the timeout or a shutdown (which
    /// answers every parked sync at once with the token it has): the waiter `/sync` and
    /// sliding sync share. Counts the sync in the metrics under `api`, and each wake-up's
    /// delay; the answer comes with when the sync resumed for it, for the delivery metrics.
    pub(super) async fn long_poll<T, F, Fut>(
        &self,
        user_id: &str,
        api: &'static str,
        timeout: Duration,
        at_once: bool,
        mut compute: F,
    ) -> Result<(T, Resumed)>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<Computed<T>>>,
    {
        let mut timing = PollTiming::default();
        let mut shutdown = self.notifier.shutdown_signal();
        // A sync arriving during a shutdown is answered at once.
        let timeout = if *shutdown.borrow() {
            Duration::ZERO
        } else {
            timeout.min(MAX_TIMEOUT)
        };
        let deadline = tokio::time::Instant::now() + timeout;
        let waiter = self.notifier.subscribe(user_id);
        let mut resumed = Resumed::none();
        // The positions taken when this sync last started reading after a wake-up, while
        // some of them were not yet persisted: a write it was woken for may be committed but
        // still behind another writer's uncommitted position, whose commit (or rollback, or
        // crash) wakes nobody here. It looks again shortly until they are all persisted.
        let mut held_below: Option<streams::Positions> = None;
        let mut fresh = true;
        let mut recheck = HELD_BACK_RECHECK_FIRST;
        let result = loop {
            // Registered before reading, so a commit between the read and the wait still wakes us.
            let woken = waiter.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            // Boxed (here and below): the computation's state, many KiB, would otherwise be
            // part of this future's, and so of every parked sync's memory while it waits.
            // Taken apart: only the (empty) response is kept while parked, for a shutdown.
            let Computed {
                response,
                empty,
                positions,
            } = match timing.build(Box::pin(compute())).await {
                Ok(computed) => computed,
                Err(err) => break Err(err),
            };
            if !empty {
                break Ok((response, resumed));
            }
            if at_once || tokio::time::Instant::now() >= deadline {
                break Ok((response, Resumed::none()));
            }
            if fresh {
                recheck = HELD_BACK_RECHECK_FIRST;
            }
            held_below = still_held_back(held_below, positions, fresh);
            let wake_at = match held_below {
                Some(_) => (tokio::time::Instant::now() + recheck).min(deadline),
                None => deadline,
            };
            recheck = (recheck * 2).min(HELD_BACK_RECHECK_MAX);
            let parked = tokio::time::Instant::now();
            let _long_poll = crate::metrics::LongPollGuard::new();
            timing.parked = true;
            tokio::select! {
                _ = woken => {
                    fresh = true;
                    resumed = Resumed::now();
                    if let Some(arrived) = waiter.last_arrival() {
                        crate::metrics::metrics()
                            .delivery_wake
                            .get_or_create(&crate::metrics::ApiLabel { api })
                            .observe(arrived.elapsed().as_secs_f64());
                    }
                }
                // Stopping: what was computed is a valid, empty answer with a token that loses
                // nothing.
                _ = shutdown.wait_for(|stopping| *stopping) => {
                    timing.waited += parked.elapsed();
                    break Ok((response, Resumed::none()));
                }
                _ = tokio::time::sleep_until(wake_at) => {
                    if wake_at >= deadline {
                        timing.waited += parked.elapsed();
                        break timing
                            .build(Box::pin(compute()))
                            .await
                            .map(|c| (c.response, Resumed::none()));
                    }
                    fresh = false;
                }
            }
            timing.waited += parked.elapsed();
        };
        timing.record(api, at_once);
        result
    }
}
