//! Per-user push rules: the server defaults until the user changes something, then the
//! user's whole ruleset, kept as the `m.push_rules` global account data clients sync.

use std::{
    collections::HashMap,
    num::NonZeroUsize,
    sync::{Arc, LazyLock, Mutex},
};

use diesel_async::AsyncPgConnection;
use lru::LruCache;
use ruma::{
    push::{InsertPushRuleError, RemovePushRuleError, Ruleset},
    UserId,
};
use serde_json::{json, Value};

use crate::{
    error::{Error, Result},
    service::notifier::USER_CHANNEL,
    storage::{account_data as store, rooms::notify, Db},
};

/// The account-data type push rules are kept under.
pub const PUSH_RULES_TYPE: &str = "m.push_rules";

/// The push rules service.
pub struct PushRules {
    db: Db,
}

/// The ruleset stored in an `m.push_rules` account-data content, if it parses.
fn parse_stored(content: Value) -> Option<Ruleset> {
    serde_json::from_value(content.get("global")?.clone()).ok()
}

/// A user's ruleset: what they stored, or the server defaults.
pub async fn load_ruleset(conn: &AsyncPgConnection, user_id: &UserId) -> Result<Ruleset> {
    Ok(
        store::get_account_data(conn, user_id.as_str(), store::GLOBAL, PUSH_RULES_TYPE)
            .await?
            .and_then(parse_stored)
            .unwrap_or_else(|| Ruleset::server_default(user_id)),
    )
}

/// User ID -> (account-data position, parsed ruleset).
type RulesetCache = LruCache<String, (i64, Arc<Ruleset>)>;

/// Parsed rulesets by user, tagged with the account-data position they were read at (0: the
/// server defaults). A stored ruleset is parsed again only when its position moves, so the
/// cache stays right across server processes without any invalidation.
static RULESETS: LazyLock<Mutex<RulesetCache>> =
    LazyLock::new(|| Mutex::new(LruCache::new(NonZeroUsize::new(50_000).expect("non-zero"))));

/// The rulesets of several users (server defaults for those who changed nothing): one query
/// for their positions, and one more only for rulesets changed since they were cached.
pub async fn load_rulesets(
    conn: &AsyncPgConnection,
    user_ids: &[&UserId],
) -> Result<HashMap<String, Arc<Ruleset>>> {
    let ids: Vec<&str> = user_ids.iter().map(|u| u.as_str()).collect();
    let positions: HashMap<String, i64> =
        store::get_global_account_data_positions(conn, &ids, PUSH_RULES_TYPE)
            .await?
            .into_iter()
            .collect();
    let mut found = HashMap::new();
    let mut stale = Vec::new();
    {
        let mut cache = RULESETS.lock().unwrap_or_else(|e| e.into_inner());
        for user in user_ids {
            let position = positions.get(user.as_str()).copied().unwrap_or(0);
            match cache.get(user.as_str()) {
                Some((cached_at, rules)) if *cached_at == position => {
                    found.insert(user.to_string(), rules.clone());
                    crate::metrics::metrics().cache("push_rules", true);
                }
                _ if position == 0 => {
                    let rules = Arc::new(Ruleset::server_default(user));
                    cache.put(user.to_string(), (0, rules.clone()));
                    found.insert(user.to_string(), rules);
                }
                _ => {
                    crate::metrics::metrics().cache("push_rules", false);
                    stale.push(user.as_str());
                }
            }
        }
    }
    if !stale.is_empty() {
        let stored = store::get_global_account_data_of_users(conn, &stale, PUSH_RULES_TYPE).await?;
        let mut cache = RULESETS.lock().unwrap_or_else(|e| e.into_inner());
        for (user, content) in stored {
            let Ok(user_id) = UserId::parse(user.as_str()) else {
                continue;
            };
            let rules = Arc::new(
                parse_stored(content).unwrap_or_else(|| Ruleset::server_default(&user_id)),
            );
            let position = positions.get(&user).copied().unwrap_or(0);
            cache.put(user.clone(), (position, rules.clone()));
            found.insert(user, rules);
        }
    }
    Ok(found)
}

/// The `m.push_rules` account-data event of a ruleset.
pub fn push_rules_event(rules: &Ruleset) -> Value {
    json!({ "type": PUSH_RULES_TYPE, "content": { "global": rules } })
}

/// Maps ruma's insert errors onto the errors Synapse returns for them.
pub fn insert_error(err: InsertPushRuleError) -> Error {
    match err {
        InsertPushRuleError::UnknownRuleId => {
            Error::not_found("The rule named in before/after does not exist")
        }
        InsertPushRuleError::ServerDefaultRuleId => {
            Error::invalid_param("Rule IDs starting with '.' are reserved for server defaults")
        }
        InsertPushRuleError::InvalidRuleId => {
            Error::invalid_param("Rule IDs may not contain '/' or '\\'")
        }
        InsertPushRuleError::RelativeToServerDefaultRule => {
            Error::invalid_param("Rules cannot be placed relative to server-default rules")
        }
        InsertPushRuleError::BeforeHigherThanAfter => {
            Error::invalid_param("'before' names a rule ranked above 'after'")
        }
        other => Error::invalid_param(other.to_string()),
    }
}

/// Maps ruma's removal errors.
pub fn remove_error(err: RemovePushRuleError) -> Error {
    match err {
        RemovePushRuleError::ServerDefault => {
            Error::invalid_param("Server-default rules cannot be deleted")
        }
        _ => Error::not_found("No such push rule"),
    }
}

impl PushRules {
    /// Creates the service.
    pub fn new(db: Db) -> Self {
        PushRules { db }
    }

    /// The user's ruleset.
    pub async fn get(&self, user_id: &UserId) -> Result<Ruleset> {
        let conn = self.db.conn().await?;
        load_ruleset(&conn, user_id).await
    }

    /// Changes the user's ruleset in one transaction (a concurrent change waits, so none is
    /// lost) and wakes their syncs with the new `m.push_rules`.
    pub async fn update(
        &self,
        user_id: &UserId,
        change: impl FnOnce(&mut Ruleset) -> Result<()> + Send,
    ) -> Result<()> {
        let mut conn = self.db.conn().await?;
        crate::storage::transaction::transaction(&mut conn, async |conn| {
            store::lock_account_data_row(conn, user_id.as_str(), store::GLOBAL, PUSH_RULES_TYPE)
                .await?;
            let mut rules = load_ruleset(conn, user_id).await?;
            change(&mut rules)?;
            let content = json!({ "global": rules });
            store::set_account_data(
                conn,
                user_id.as_str(),
                store::GLOBAL,
                PUSH_RULES_TYPE,
                &content,
            )
            .await?;
            notify(conn, USER_CHANNEL, user_id.as_str()).await?;
            Ok(())
        })
        .await
    }
}
