//! Per-statement database time (`myelin_db_query_seconds`), from diesel's connection
//! instrumentation: every connection the pools make carries a [`QueryTimer`] (see
//! [`install`]).
//!
//! diesel reports a statement's start when its future is made and its finish when the result
//! is in, with nothing tying the two together. Statements pipelined on one connection get
//! their results in the order they were sent, so starts wait in a queue and each finish takes
//! the oldest: a pipelined statement's time includes its wait behind the ones before it,
//! which is what its caller waited. A statement whose future is dropped unfinished never
//! reports its finish; the queue is emptied whenever a transaction begins (nothing of the
//! connection's holder is in flight then) and kept short, so such a leftover skews a few
//! timings of one connection at most. Recording allocates nothing: the statement's kind is
//! read from the first word of its SQL, never kept.

use std::{collections::VecDeque, fmt, time::Instant};

use diesel::connection::{Instrumentation, InstrumentationEvent};

use crate::metrics::{metrics, StatementLabel};

/// Starts queued at most (more means finishes went missing: start again).
const MAX_IN_FLIGHT: usize = 64;

/// Times one connection's statements.
#[derive(Default)]
struct QueryTimer {
    started: VecDeque<Instant>,
}

impl Instrumentation for QueryTimer {
    fn on_connection_event(&mut self, event: InstrumentationEvent<'_>) {
        match event {
            InstrumentationEvent::StartQuery { .. } => {
                if self.started.len() >= MAX_IN_FLIGHT {
                    self.started.clear();
                }
                self.started.push_back(Instant::now());
            }
            InstrumentationEvent::FinishQuery { query, .. } => {
                let Some(started) = self.started.pop_front() else {
                    return;
                };
                let statement = statement_kind(query);
                metrics()
                    .db_query
                    .get_or_create(&StatementLabel { statement })
                    .observe(started.elapsed().as_secs_f64());
            }
            InstrumentationEvent::BeginTransaction { depth, .. } if depth.get() == 1 => {
                self.started.clear();
            }
            _ => {}
        }
    }
}

/// Gives every database connection made from now on a [`QueryTimer`].
pub fn install() {
    let installed =
        diesel::connection::set_default_instrumentation(|| Some(Box::new(QueryTimer::default())));
    if let Err(err) = installed {
        tracing::warn!("no per-statement database metrics: {err}");
    }
}

/// The kind of a statement, one of [`crate::metrics::STATEMENTS`], from its SQL's first word.
fn statement_kind(sql: &(impl fmt::Display + ?Sized)) -> &'static str {
    let mut word = FirstWord::default();
    // The writer stops the formatting once the word is read: that error is expected.
    let _ = fmt::write(&mut word, format_args!("{sql}"));
    let word = &word.bytes[..word.len];
    let is = |keyword: &str| word.eq_ignore_ascii_case(keyword.as_bytes());
    if is("select") {
        "select"
    } else if is("insert") {
        "insert"
    } else if is("update") {
        "update"
    } else if is("delete") {
        "delete"
    } else if [
        "begin",
        "commit",
        "rollback",
        "savepoint",
        "release",
        "start",
    ]
    .into_iter()
    .any(is)
    {
        "transaction"
    } else {
        "other"
    }
}

/// Keeps the first word of what is written to it (up to 16 bytes), on the stack.
#[derive(Default)]
struct FirstWord {
    bytes: [u8; 16],
    len: usize,
    /// A word started and ended: nothing more is wanted.
    done: bool,
}

impl fmt::Write for FirstWord {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        for &byte in text.as_bytes() {
            if byte.is_ascii_alphabetic() {
                if self.len == self.bytes.len() {
                    self.done = true;
                    break;
                }
                self.bytes[self.len] = byte;
                self.len += 1;
            } else if self.len > 0 {
                self.done = true;
                break;
            }
            // Leading whitespace or parentheses: keep looking.
        }
        if self.done {
            Err(fmt::Error)
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::statement_kind;

    #[test]
    fn statement_kinds_come_from_the_first_word() {
        assert_eq!(statement_kind(&"SELECT 1"), "select");
        assert_eq!(statement_kind(&"\n  select * from events"), "select");
        assert_eq!(statement_kind(&"(SELECT 1) UNION (SELECT 2)"), "select");
        assert_eq!(statement_kind(&"INSERT INTO events VALUES ($1)"), "insert");
        assert_eq!(statement_kind(&"UPDATE rooms SET x = 1"), "update");
        assert_eq!(statement_kind(&"DELETE FROM rooms"), "delete");
        assert_eq!(statement_kind(&"BEGIN"), "transaction");
        assert_eq!(statement_kind(&"COMMIT"), "transaction");
        assert_eq!(
            statement_kind(&"SAVEPOINT diesel_savepoint_1"),
            "transaction"
        );
        assert_eq!(
            statement_kind(&"WITH c AS (SELECT 1) SELECT * FROM c"),
            "other"
        );
        assert_eq!(statement_kind(&"SELECTED"), "other");
        assert_eq!(statement_kind(&"averyveryverylongidentifier"), "other");
        assert_eq!(statement_kind(&""), "other");
    }
}
