//! Gauges read when Prometheus scrapes, rather than kept up to date on every change: pool
//! occupancy and stream positions.

use crate::{
    metrics::{metrics, PoolLabel, PoolStateLabels, StreamLabel},
    storage::{streams, Db},
};

/// Sets the pool and stream-position gauges from what they are now.
pub async fn refresh(db: &Db) {
    let metrics = metrics();
    for (pool, status) in db.pool_statuses() {
        let busy = status.size.saturating_sub(status.idle);
        for (state, n) in [("idle", status.idle), ("busy", busy)] {
            metrics
                .db_pool_connections
                .get_or_create(&PoolStateLabels { pool, state })
                .set(n as i64);
        }
        metrics
            .db_pool_max_connections
            .get_or_create(&PoolLabel { pool })
            .set(status.max_size as i64);
        metrics
            .db_pool_waiting
            .get_or_create(&PoolLabel { pool })
            .set(status.waiting as i64);
    }
    let positions = match db.conn().await {
        Ok(conn) => streams::positions(&conn).await.map_err(|e| e.to_string()),
        Err(err) => Err(err.to_string()),
    };
    match positions {
        Ok(positions) => {
            for (stream, taken, persisted) in positions.each() {
                let label = StreamLabel {
                    stream: stream.to_owned(),
                };
                metrics.stream_position.get_or_create(&label).set(taken);
                metrics
                    .stream_persisted_upto
                    .get_or_create(&label)
                    .set(persisted);
            }
        }
        Err(err) => tracing::warn!("metrics: cannot read stream positions: {err}"),
    }
}
