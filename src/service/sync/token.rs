//! Sync tokens (`next_batch`/`since`) and pagination tokens (`prev_batch`, `/messages`).
//!
//! A sync token holds one position per stream:
//! `s{events}_{account_data}_{receipts}_{typing}_{presence}_{device_lists}_{to_device}`.
//! Streams added later append positions; older tokens with fewer positions read the missing
//! ones as 0.
//!
//! A pagination token `t{depth}_{stream}` is a point in a room's history in topological order,
//! just after the event at `(depth, stream)` (see [`HistoryPosition`]). The older form
//! `t{stream}`, and a sync token, is a point in stream order: `/messages` places it just after
//! the room's newest event at or before that position, which is exact for linear history
//! (every token issued before the room DAG, and every room only our server writes to). A sync
//! whose timeline is empty still hands it out as `prev_batch` (that lookup is left to the
//! `/messages` that needs it). `/relations` and `/threads` page in stream order with `t{stream}`
//! and read a topological token by its stream part.

use crate::{
    error::{Error, Result},
    storage::dag::HistoryPosition,
};

/// Positions in every stream a sync reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SyncToken {
    /// Room event stream.
    pub events: i64,
    /// Account data stream.
    pub account_data: i64,
    /// Read-receipt stream.
    pub receipts: i64,
    /// Typing changes (an in-memory clock, see [`crate::service::typing`]).
    pub typing: i64,
    /// Presence stream.
    pub presence: i64,
    /// Device-list changes.
    pub device_lists: i64,
    /// To-device messages (this device's inbox).
    pub to_device: i64,
}

impl SyncToken {
    /// Parses `s{events}_{account_data}_{receipts}_{typing}_{presence}_{device_lists}_{to_device}`; anything else is `M_INVALID_PARAM`.
    pub fn parse(token: &str) -> Result<Self> {
        let invalid = || Error::invalid_param(format!("Invalid sync token: {token}"));
        let body = token.strip_prefix('s').ok_or_else(invalid)?;
        let mut positions = body
            .split('_')
            .map(|p| p.parse::<i64>().ok().filter(|n| *n >= 0));
        let events = positions.next().flatten().ok_or_else(invalid)?;
        let mut next = || match positions.next() {
            Some(position) => position.ok_or_else(invalid),
            None => Ok(0),
        };
        let account_data = next()?;
        let receipts = next()?;
        let typing = next()?;
        let presence = next()?;
        let device_lists = next()?;
        let to_device = next()?;
        Ok(SyncToken {
            events,
            account_data,
            receipts,
            typing,
            presence,
            device_lists,
            to_device,
        })
    }
}

impl std::fmt::Display for SyncToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "s{}_{}_{}_{}_{}_{}_{}",
            self.events,
            self.account_data,
            self.receipts,
            self.typing,
            self.presence,
            self.device_lists,
            self.to_device
        )
    }
}

/// A parsed pagination token: a point in a room's history, after which (backwards: at or
/// before which) to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pagination {
    /// `t{depth}_{stream}`: a point in topological order.
    Topological(HistoryPosition),
    /// `t{stream}` or a sync token: a point in stream order.
    Stream(i64),
}

impl Pagination {
    /// The stream position part, for what pages in stream order (`/relations`, `/threads`).
    pub fn stream(self) -> i64 {
        match self {
            Pagination::Topological(position) => position.stream,
            Pagination::Stream(stream) => stream,
        }
    }
}

/// Parses a pagination token (see the module doc for its forms).
pub fn parse_pagination(token: &str) -> Result<Pagination> {
    let invalid = || Error::invalid_param("Invalid pagination token");
    if let Some(body) = token.strip_prefix('t') {
        return match body.split_once('_') {
            Some((depth, stream)) => match (depth.parse::<i64>(), stream.parse::<i64>()) {
                (Ok(depth), Ok(stream)) => {
                    Ok(Pagination::Topological(HistoryPosition { depth, stream }))
                }
                _ => Err(invalid()),
            },
            None => body
                .parse::<i64>()
                .ok()
                .filter(|n| *n >= 0)
                .map(Pagination::Stream)
                .ok_or_else(invalid),
        };
    }
    // A sync token works as a pagination token too (its event position).
    SyncToken::parse(token)
        .map(|t| Pagination::Stream(t.events))
        .map_err(|_| invalid())
}

/// Formats a pagination token for a point in topological order.
pub fn pagination(position: HistoryPosition) -> String {
    format!("t{}_{}", position.depth, position.stream)
}

/// Formats a pagination token for a point in stream order.
pub fn stream_pagination(position: i64) -> String {
    format!("t{}", position.max(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_bad_tokens_are_rejected() {
        let token = SyncToken {
            events: 42,
            account_data: 7,
            receipts: 3,
            typing: 1_700_000_000_000,
            presence: 9,
            device_lists: 4,
            to_device: 11,
        };
        assert_eq!(SyncToken::parse(&token.to_string()).unwrap(), token);
        assert_eq!(
            SyncToken::parse("s5").unwrap(),
            SyncToken {
                events: 5,
                account_data: 0,
                receipts: 0,
                typing: 0,
                presence: 0,
                device_lists: 0,
                to_device: 0,
            }
        );
        for bad in ["", "s", "x5_1", "s-1_2", "sabc", "s1_x", "s1_-3"] {
            assert!(SyncToken::parse(bad).is_err(), "{bad} accepted");
        }
        assert_eq!(parse_pagination("t17").unwrap(), Pagination::Stream(17));
        assert_eq!(parse_pagination("s9_3").unwrap(), Pagination::Stream(9));
        let point = HistoryPosition {
            depth: 12,
            stream: -4,
        };
        assert_eq!(
            parse_pagination(&pagination(point)).unwrap(),
            Pagination::Topological(point)
        );
        assert_eq!(parse_pagination("t12_-4").unwrap().stream(), -4);
        for bad in ["t", "t-1", "t_", "t1_", "t_1", "tx_1", "t1_2_3", "t1_y"] {
            assert!(parse_pagination(bad).is_err(), "{bad} accepted");
        }
    }
}
