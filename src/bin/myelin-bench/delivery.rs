//! Scenarios 3 and 7: the time from a send until one long-polling receiver has the message,
//! and until every member of a big room long-polling has it.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use futures_util::{StreamExt, TryStreamExt};
use serde_json::{json, Value};

use crate::{
    client::{next_batch, timeline_events, Failure, User},
    stats::Samples,
    Bench, Counts,
};

/// Scenario 3: time from the start of the sender's PUT until the long-polling receiver has
/// the event.
pub(crate) async fn delivery(bench: &Bench, n: usize) -> Result<(Value, Samples), Failure> {
    let (sender, receiver, room) = bench.pair_in_room("dlv").await?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(String, Instant)>();
    let poller = tokio::spawn(async move {
        let mut since = next_batch(&receiver.sync(None, Duration::ZERO, None).await?);
        loop {
            let sync = receiver
                .sync(Some(&since), Duration::from_secs(30), None)
                .await?;
            let arrived = Instant::now();
            since = next_batch(&sync);
            for (_, _, body) in timeline_events(&sync) {
                if tx.send((body, arrived)).is_err() {
                    return Ok::<_, Failure>(());
                }
            }
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut samples = Samples::default();
    for i in 0..n {
        let body = format!("ping {i}");
        let started = Instant::now();
        sender.send(&room, &format!("d{i}"), &body).await?;
        loop {
            let (got, at) = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .map_err(|_| "a message never arrived".to_owned())?
                .ok_or("the receiver stopped")?;
            if got == body {
                samples.push(at.duration_since(started));
                break;
            }
        }
    }
    poller.abort();
    Ok((samples.summary(), samples))
}

/// Scenario 7: one message into a big room; time until every long-poller has it.
pub(crate) async fn fanout(bench: &Bench, counts: &Counts) -> Result<Value, Failure> {
    let mut members = bench.users("fan", counts.fanout_members).await?;
    let sender = members.remove(0);
    let room = sender
        .create_room(json!({ "preset": "public_chat" }))
        .await?;
    for member in &members {
        member.join(&room).await?;
    }
    bench.analyze().await;
    let pollers: Vec<User> = members.into_iter().take(counts.fanout_pollers).collect();
    let mut summary = reach_pollers(
        pollers,
        None,
        || sender.send(&room, "fan", "fan-out"),
        "fan-out",
    )
    .await?;
    summary["members"] = json!(counts.fanout_members);
    summary["pollers"] = json!(counts.fanout_pollers);
    summary["all_received_ms"] = summary["max_ms"].clone();
    Ok(summary)
}

/// Time from the start of a send until each of `pollers`, long-polling `/sync` (with
/// `filter`, from where an initial sync left them), has the message whose body is `body`.
/// The send waits until every poller's long-poll has been waiting for a while (catching up
/// on the others' first syncs is not the delivery measured), or a minute: the summary's
/// `settled` says which.
pub(crate) async fn reach_pollers<F: std::future::Future<Output = Result<String, Failure>>>(
    pollers: Vec<User>,
    filter: Option<String>,
    send: impl FnOnce() -> F,
    body: &'static str,
) -> Result<Value, Failure> {
    let tokens: Vec<String> = futures_util::stream::iter(&pollers)
        .map(|poller| async {
            Ok::<_, Failure>(next_batch(
                &poller.sync(None, Duration::ZERO, filter.as_deref()).await?,
            ))
        })
        .buffered(8)
        .try_collect()
        .await?;
    let started = Arc::new(tokio::sync::OnceCell::<Instant>::new());
    // When each poller's current long-poll was sent, in milliseconds from `origin` (`MAX`:
    // not sent yet).
    let origin = Instant::now();
    let waiting_since: Arc<Vec<AtomicU64>> =
        Arc::new(pollers.iter().map(|_| AtomicU64::new(u64::MAX)).collect());
    let waits: Vec<_> = pollers
        .into_iter()
        .zip(tokens)
        .enumerate()
        .map(|(i, (poller, mut since))| {
            let (started, filter) = (started.clone(), filter.clone());
            let waiting_since = waiting_since.clone();
            tokio::spawn(async move {
                loop {
                    let now = origin.elapsed().as_millis() as u64;
                    waiting_since[i].store(now, Ordering::Relaxed);
                    let sync = poller
                        .sync(Some(&since), Duration::from_secs(30), filter.as_deref())
                        .await?;
                    since = next_batch(&sync);
                    if timeline_events(&sync).iter().any(|(_, _, b)| b == body) {
                        let start = *started.get().ok_or("arrived before it was sent")?;
                        return Ok::<_, Failure>(start.elapsed());
                    }
                }
            })
        })
        .collect();
    // Every poller parked: each one's long-poll has been waiting for two seconds.
    let quiet = Duration::from_secs(2).as_millis() as u64;
    let settle_by = Instant::now() + Duration::from_secs(60);
    let settled = loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = origin.elapsed().as_millis() as u64;
        let newest_wait = waiting_since
            .iter()
            .map(|at| at.load(Ordering::Relaxed))
            .max();
        if newest_wait.is_some_and(|at| at != u64::MAX && now.saturating_sub(at) >= quiet) {
            break true;
        }
        if Instant::now() >= settle_by {
            break false;
        }
    };
    started.set(Instant::now()).ok();
    send().await?;
    let mut samples = Samples::default();
    for wait in waits {
        let elapsed = tokio::time::timeout(Duration::from_secs(60), wait)
            .await
            .map_err(|_| "a poller never got the message".to_owned())?
            .map_err(|e| e.to_string())??;
        samples.push(elapsed);
    }
    let mut summary = samples.summary();
    summary["settled"] = json!(settled);
    Ok(summary)
}
