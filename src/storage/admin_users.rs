//! The admin API's view of accounts: the user list with its filters and orders, one user's
//! details, the erased flag and per-user rate-limit overrides.

use diesel::{
    prelude::*,
    sql_types::{BigInt, Bool, Nullable, Text},
};
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::schema::{user_ratelimit_overrides, users};

/// One account as the admin API lists it.
#[derive(Debug, Clone, QueryableByName)]
pub struct AdminUserRow {
    /// Full user ID.
    #[diesel(sql_type = Text)]
    pub user_id: String,
    /// Server administrator.
    #[diesel(sql_type = Bool)]
    pub is_admin: bool,
    /// Deactivated.
    #[diesel(sql_type = Bool)]
    pub deactivated: bool,
    /// Deactivated with erasure.
    #[diesel(sql_type = Bool)]
    pub erased: bool,
    /// Shadow-banned.
    #[diesel(sql_type = Bool)]
    pub shadow_banned: bool,
    /// Display name.
    #[diesel(sql_type = Nullable<Text>)]
    pub displayname: Option<String>,
    /// Avatar URL.
    #[diesel(sql_type = Nullable<Text>)]
    pub avatar_url: Option<String>,
    /// Creation time, ms.
    #[diesel(sql_type = BigInt)]
    pub created_ts: i64,
    /// Latest use of any of the user's devices, ms.
    #[diesel(sql_type = Nullable<BigInt>)]
    pub last_seen_ts: Option<i64>,
}

/// Column a user list is ordered by (then by user ID, ascending).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserOrder {
    /// The user ID (Synapse's `name`).
    Name,
    /// The admin flag.
    Admin,
    /// The deactivated flag.
    Deactivated,
    /// The shadow-ban flag.
    ShadowBanned,
    /// The display name.
    Displayname,
    /// The avatar URL.
    AvatarUrl,
    /// The creation time.
    CreationTs,
    /// The last time a device was used.
    LastSeenTs,
}

impl UserOrder {
    fn column(self) -> &'static str {
        match self {
            UserOrder::Name => "user_id",
            UserOrder::Admin => "is_admin",
            UserOrder::Deactivated => "deactivated",
            UserOrder::ShadowBanned => "shadow_banned",
            UserOrder::Displayname => "displayname",
            UserOrder::AvatarUrl => "avatar_url",
            UserOrder::CreationTs => "created_ts",
            UserOrder::LastSeenTs => "last_seen_ts",
        }
    }
}

/// Which users a list shows and in what order.
#[derive(Debug, Clone, Default)]
pub struct UserQuery {
    /// Only user IDs containing this (ignored when `name` is set).
    pub user_id: Option<String>,
    /// Only users whose localpart or display name contains this.
    pub name: Option<String>,
    /// Only (`Some(true)`) or no (`Some(false)`) deactivated users.
    pub deactivated: Option<bool>,
    /// Only (`Some(true)`) or no (`Some(false)`) admins.
    pub admins: Option<bool>,
    /// The order, and whether it is descending.
    pub order: Option<(UserOrder, bool)>,
}

const USER_COLUMNS: &str =
    "SELECT u.user_id, u.is_admin, u.deactivated, u.erased, u.shadow_banned, \
     dn.value #>> '{}' AS displayname, av.value #>> '{}' AS avatar_url, u.created_ts, \
     (SELECT max(d.last_seen_ts) FROM devices d WHERE d.user_id = u.user_id) AS last_seen_ts \
     FROM users u \
     LEFT JOIN profile_fields dn ON dn.user_id = u.user_id AND dn.field_name = 'displayname' \
     LEFT JOIN profile_fields av ON av.user_id = u.user_id AND av.field_name = 'avatar_url'";

const USER_FILTERS: &str = " WHERE ($1::text IS NULL OR u.user_id ILIKE $1) \
     AND ($2::text IS NULL OR u.localpart ILIKE $2 OR dn.value #>> '{}' ILIKE $2) \
     AND ($3::bool IS NULL OR u.deactivated = $3) \
     AND ($4::bool IS NULL OR u.is_admin = $4)";

/// A page of users matching `query` and how many match in all.
pub async fn list_users(
    mut conn: &AsyncPgConnection,
    query: &UserQuery,
    from: i64,
    limit: i64,
) -> QueryResult<(Vec<AdminUserRow>, i64)> {
    let (user_id, name) = match &query.name {
        Some(name) => (None, Some(super::like_contains(name))),
        None => (query.user_id.as_deref().map(super::like_contains), None),
    };
    let (order, descending) = query.order.unwrap_or((UserOrder::Name, false));
    let direction = if descending { "DESC" } else { "ASC" };
    // The ORDER BY text comes from a fixed set, so the statement cache stays bounded.
    let page_sql = format!(
        "SELECT * FROM ({USER_COLUMNS}{USER_FILTERS}) t ORDER BY {} {direction}, user_id ASC \
         OFFSET $5 LIMIT $6",
        order.column()
    );
    let rows = super::cached_sql(page_sql)
        .bind::<Nullable<Text>, _>(user_id.as_deref())
        .bind::<Nullable<Text>, _>(name.as_deref())
        .bind::<Nullable<Bool>, _>(query.deactivated)
        .bind::<Nullable<Bool>, _>(query.admins)
        .bind::<BigInt, _>(from)
        .bind::<BigInt, _>(limit)
        .load::<AdminUserRow>(&mut conn)
        .await?;
    #[derive(QueryableByName)]
    struct Total {
        #[diesel(sql_type = BigInt)]
        total: i64,
    }
    let total = super::cached_sql(format!(
        "SELECT count(*) AS total FROM users u \
         LEFT JOIN profile_fields dn ON dn.user_id = u.user_id AND dn.field_name = 'displayname'\
         {USER_FILTERS}"
    ))
    .bind::<Nullable<Text>, _>(user_id.as_deref())
    .bind::<Nullable<Text>, _>(name.as_deref())
    .bind::<Nullable<Bool>, _>(query.deactivated)
    .bind::<Nullable<Bool>, _>(query.admins)
    .get_result::<Total>(&mut conn)
    .await?
    .total;
    Ok((rows, total))
}

/// One account as the admin API shows it.
pub async fn get_user(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Option<AdminUserRow>> {
    super::cached_sql(format!("{USER_COLUMNS} WHERE u.user_id = $1"))
        .bind::<Text, _>(user_id)
        .get_result(&mut conn)
        .await
        .optional()
}

/// Sets the admin flag; false for unknown users.
pub async fn set_admin(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    admin: bool,
) -> QueryResult<bool> {
    Ok(diesel::update(users::table.find(user_id))
        .set(users::is_admin.eq(admin))
        .execute(&mut conn)
        .await?
        > 0)
}

/// Marks a (deactivated) account erased.
pub async fn set_erased(mut conn: &AsyncPgConnection, user_id: &str) -> QueryResult<()> {
    diesel::update(users::table.find(user_id))
        .set(users::erased.eq(true))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Lets a deactivated account log in again with a new password.
pub async fn reactivate(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    password_hash: &str,
) -> QueryResult<()> {
    diesel::update(users::table.find(user_id))
        .set((
            users::deactivated.eq(false),
            users::erased.eq(false),
            users::password_hash.eq(password_hash),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// A user's rate-limit override: `(messages_per_second, burst_count)`.
pub async fn get_ratelimit_override(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Option<(i64, i64)>> {
    user_ratelimit_overrides::table
        .find(user_id)
        .select((
            user_ratelimit_overrides::messages_per_second,
            user_ratelimit_overrides::burst_count,
        ))
        .first(&mut conn)
        .await
        .optional()
}

/// Sets a user's rate-limit override.
pub async fn set_ratelimit_override(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    messages_per_second: i64,
    burst_count: i64,
) -> QueryResult<()> {
    diesel::insert_into(user_ratelimit_overrides::table)
        .values((
            user_ratelimit_overrides::user_id.eq(user_id),
            user_ratelimit_overrides::messages_per_second.eq(messages_per_second),
            user_ratelimit_overrides::burst_count.eq(burst_count),
        ))
        .on_conflict(user_ratelimit_overrides::user_id)
        .do_update()
        .set((
            user_ratelimit_overrides::messages_per_second.eq(messages_per_second),
            user_ratelimit_overrides::burst_count.eq(burst_count),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Removes a user's rate-limit override.
pub async fn delete_ratelimit_override(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<()> {
    diesel::delete(user_ratelimit_overrides::table.find(user_id))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// What decides a sender's message rate limit: whether they are a server admin and their
/// override `(messages_per_second, burst_count)`, if any. Unknown users are neither.
pub async fn get_message_limit(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<(bool, Option<(i64, i64)>)> {
    #[derive(QueryableByName)]
    struct Limit {
        #[diesel(sql_type = Bool)]
        is_admin: bool,
        #[diesel(sql_type = Nullable<BigInt>)]
        messages_per_second: Option<i64>,
        #[diesel(sql_type = Nullable<BigInt>)]
        burst_count: Option<i64>,
    }
    let row: Option<Limit> = super::cached_sql(
        "SELECT u.is_admin, o.messages_per_second, o.burst_count FROM users u \
         LEFT JOIN user_ratelimit_overrides o ON o.user_id = u.user_id WHERE u.user_id = $1",
    )
    .bind::<Text, _>(user_id)
    .get_result(&mut conn)
    .await
    .optional()?;
    Ok(row.map_or((false, None), |row| {
        let limit = row.messages_per_second.zip(row.burst_count);
        (row.is_admin, limit)
    }))
}
