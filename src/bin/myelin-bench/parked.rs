//! Scenario 10: many idle long-polling `/sync` connections on one server (a client in every
//! pocket): the memory each parked connection costs the server, and whether delivering one
//! message to one client slows while they wait.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{
    client::{next_batch, timeline_events, Failure, User},
    rss_kib,
    stats::{round, Samples},
    Bench,
};

/// Deliveries measured with and without the parked connections.
const DELIVERIES: usize = 20;
/// Most CPU time the server may have used in the last second for the connections to count as
/// parked: a fifth of a core, in the kernel's clock ticks (100 a second on Linux).
const IDLE_CPU_TICKS: u64 = 20;
/// Connections opened at once: a burst beyond the listen backlog would wait out SYN retries.
const OPEN_AT_ONCE: usize = 500;

pub async fn parked_connections(
    bench: &Bench,
    pid: Option<u32>,
    connections: usize,
    users: usize,
) -> Result<Value, Failure> {
    let idlers = bench.users("idle", users).await?;
    let (sender, receiver, room) = bench.pair_in_room("pk").await?;
    let mut since = next_batch(&receiver.sync(None, Duration::ZERO, None).await?);

    let mut before = Samples::default();
    for i in 0..DELIVERIES {
        let (took, next) = deliver(&sender, &receiver, &room, &since, &format!("a{i}")).await?;
        before.push(took);
        since = next;
    }

    let mut tokens = Vec::with_capacity(idlers.len());
    for idler in &idlers {
        tokens.push(next_batch(&idler.sync(None, Duration::ZERO, None).await?));
    }
    let rss_before = rss_kib(pid, "VmRSS:");
    let opened = Instant::now();
    let mut pollers = Vec::with_capacity(connections);
    for chunk in (0..connections).collect::<Vec<_>>().chunks(OPEN_AT_ONCE) {
        for &i in chunk {
            let user = idlers[i % idlers.len()].clone();
            let mut since = tokens[i % tokens.len()].clone();
            // Nothing reaches these users: each poll waits out its timeout, then parks again.
            pollers.push(tokio::spawn(async move {
                loop {
                    match user.sync(Some(&since), Duration::from_secs(60), None).await {
                        Ok(sync) => since = next_batch(&sync),
                        Err(_) => tokio::time::sleep(Duration::from_secs(1)).await,
                    }
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let port = reqwest::Url::parse(&bench.url)
        .ok()
        .and_then(|url| url.port_or_known_default())
        .ok_or("the server URL has no port")?;
    // Accepted by the kernel is not yet parked by the server: connections count first, then
    // the server's memory must stop growing.
    let deadline = Instant::now() + Duration::from_secs(120);
    while established_to(port) < connections {
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {connections} connections were established",
                established_to(port)
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Three readings a second apart within 1% of each other, and the server all but idle in
    // the last second: it has taken them all, and answered each one's first, empty read (a
    // server whose memory per request does not grow when it parks one settles in memory
    // while it still works through them, and a delivery measured then waits behind them).
    let settled = |readings: &[(u64, u64)]| {
        let last = &readings[readings.len().saturating_sub(3)..];
        let rss = last.iter().map(|&(rss, _)| rss);
        let (low, high) = (rss.clone().min(), rss.max());
        let idle = last
            .windows(2)
            .last()
            .is_some_and(|pair| pair[1].1.saturating_sub(pair[0].1) <= IDLE_CPU_TICKS);
        last.len() == 3
            && idle
            && low
                .zip(high)
                .is_some_and(|(low, high)| high - low <= high / 100)
    };
    let reading = || rss_kib(pid, "VmRSS:").zip(cpu_ticks(pid));
    let mut readings: Vec<(u64, u64)> = reading().into_iter().collect();
    while pid.is_some() && !settled(&readings) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1)).await;
        readings.extend(reading());
    }
    let rss_parked = readings.last().map(|&(rss, _)| rss);
    let open_s = opened.elapsed().as_secs_f64();

    let mut during = Samples::default();
    for i in 0..DELIVERIES {
        let (took, next) = deliver(&sender, &receiver, &room, &since, &format!("b{i}")).await?;
        during.push(took);
        since = next;
    }
    for poller in &pollers {
        poller.abort();
    }
    let per_connection_kib = rss_before
        .zip(rss_parked)
        .map(|(before, parked)| round(parked.saturating_sub(before) as f64 / connections as f64));
    Ok(json!({
        "connections": connections,
        "users": users,
        "seconds_to_park_all": round(open_s),
        "rss_before_mib": rss_before.map(|k| round(k as f64 / 1024.0)),
        "rss_parked_mib": rss_parked.map(|k| round(k as f64 / 1024.0)),
        "kib_per_parked_connection": per_connection_kib,
        "delivery_alone": before.summary(),
        "delivery_while_parked": during.summary(),
    }))
}

/// One message from `sender` to a `receiver` parked in `/sync`: the time from the start of
/// the send until the receiver's long-poll returns with it, and the receiver's next token.
async fn deliver(
    sender: &User,
    receiver: &User,
    room: &str,
    since: &str,
    txn: &str,
) -> Result<(Duration, String), Failure> {
    let body = format!("parked {txn}");
    let poll = {
        let (receiver, since, body) = (receiver.clone(), since.to_owned(), body.clone());
        tokio::spawn(async move {
            let mut since = since;
            loop {
                let sync = receiver
                    .sync(Some(&since), Duration::from_secs(30), None)
                    .await?;
                let arrived = Instant::now();
                since = next_batch(&sync);
                if timeline_events(&sync).iter().any(|(_, _, b)| *b == body) {
                    return Ok::<_, Failure>((arrived, since));
                }
            }
        })
    };
    // Parked before the message is sent.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    sender.send(room, txn, &body).await?;
    let (arrived, since) = tokio::time::timeout(Duration::from_secs(30), poll)
        .await
        .map_err(|_| "a message to a parked receiver never arrived".to_owned())?
        .map_err(|e| e.to_string())??;
    Ok((arrived.duration_since(started), since))
}

/// Established TCP connections whose local port is `port`: the server's side of them, as
/// the kernel lists them.
fn established_to(port: u16) -> usize {
    let local = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|path| std::fs::read_to_string(path).ok())
        .map(|table| {
            table
                .lines()
                .skip(1)
                .filter(|line| {
                    let fields: Vec<&str> = line.split_whitespace().collect();
                    fields.len() > 3 && fields[1].ends_with(&local) && fields[3] == "01"
                })
                .count()
        })
        .sum()
}

/// The CPU time the process has used (user and system), in clock ticks.
fn cpu_ticks(pid: Option<u32>) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid?)).ok()?;
    // The fields after the command's closing parenthesis (the command may hold spaces):
    // utime and stime are the 12th and 13th of them.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(user + system)
}
