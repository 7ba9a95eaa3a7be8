//! Users and their profile fields.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde_json::Value;

use super::schema::{profile_fields, users};

/// A row of `users`.
#[derive(Debug, Clone, Queryable, Selectable)]
#[diesel(table_name = users)]
pub struct UserRow {
    /// Full Matrix user ID.
    pub user_id: String,
    /// Argon2id PHC string; `None` for accounts that cannot log in with a password.
    pub password_hash: Option<String>,
    /// Server administrator.
    pub is_admin: bool,
    /// Deactivated accounts cannot log in.
    pub deactivated: bool,
}

/// Insert form for `users`.
#[derive(Insertable)]
#[diesel(table_name = users)]
pub struct NewUser<'a> {
    /// Full Matrix user ID.
    pub user_id: &'a str,
    /// Localpart (unique, case-folded).
    pub localpart: &'a str,
    /// Argon2id PHC string.
    pub password_hash: Option<&'a str>,
    /// Server administrator.
    pub is_admin: bool,
    /// Creation time.
    pub created_ts: i64,
}

/// Inserts a user; a duplicate user ID fails with a unique violation.
pub async fn insert_user(mut conn: &AsyncPgConnection, user: &NewUser<'_>) -> QueryResult<()> {
    diesel::insert_into(users::table)
        .values(user)
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Looks a user up by ID.
pub async fn get_user(mut conn: &AsyncPgConnection, user_id: &str) -> QueryResult<Option<UserRow>> {
    users::table
        .find(user_id)
        .select(UserRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Whether a localpart is taken (by an active or deactivated account).
pub async fn localpart_exists(mut conn: &AsyncPgConnection, localpart: &str) -> QueryResult<bool> {
    diesel::select(diesel::dsl::exists(
        users::table.filter(users::localpart.eq(localpart)),
    ))
    .get_result(&mut conn)
    .await
}

/// Replaces a user's password hash (`None` removes password login).
pub async fn set_password_hash(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    hash: Option<&str>,
) -> QueryResult<()> {
    diesel::update(users::table.find(user_id))
        .set(users::password_hash.eq(hash))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Marks a user deactivated and removes their password.
pub async fn deactivate_user(mut conn: &AsyncPgConnection, user_id: &str) -> QueryResult<()> {
    diesel::update(users::table.find(user_id))
        .set((
            users::deactivated.eq(true),
            users::password_hash.eq(None::<String>),
        ))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Locks a user's row until the end of the transaction (serialises profile writes).
pub async fn lock_user(mut conn: &AsyncPgConnection, user_id: &str) -> QueryResult<()> {
    users::table
        .find(user_id)
        .select(users::user_id)
        .for_update()
        .first::<String>(&mut conn)
        .await
        .optional()
        .map(drop)
}

/// All profile fields of a user.
pub async fn get_profile(
    mut conn: &AsyncPgConnection,
    user_id: &str,
) -> QueryResult<Vec<(String, Value)>> {
    profile_fields::table
        .filter(profile_fields::user_id.eq(user_id))
        .select((profile_fields::field_name, profile_fields::value))
        .order(profile_fields::field_name)
        .load(&mut conn)
        .await
}

/// One profile field.
pub async fn get_profile_field(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    field: &str,
) -> QueryResult<Option<Value>> {
    profile_fields::table
        .find((user_id, field))
        .select(profile_fields::value)
        .first(&mut conn)
        .await
        .optional()
}

/// Sets one profile field.
pub async fn set_profile_field(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    field: &str,
    value: &Value,
) -> QueryResult<()> {
    diesel::insert_into(profile_fields::table)
        .values((
            profile_fields::user_id.eq(user_id),
            profile_fields::field_name.eq(field),
            profile_fields::value.eq(value),
        ))
        .on_conflict((profile_fields::user_id, profile_fields::field_name))
        .do_update()
        .set(profile_fields::value.eq(value))
        .execute(&mut conn)
        .await
        .map(drop)
}

/// Deletes one profile field (or all of them with `None`).
pub async fn delete_profile_fields(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    field: Option<&str>,
) -> QueryResult<()> {
    let rows = profile_fields::table.filter(profile_fields::user_id.eq(user_id));
    match field {
        Some(field) => {
            diesel::delete(rows.filter(profile_fields::field_name.eq(field)))
                .execute(&mut conn)
                .await
        }
        None => diesel::delete(rows).execute(&mut conn).await,
    }
    .map(drop)
}

/// Whether a user is shadow-banned.
pub async fn is_shadow_banned(mut conn: &AsyncPgConnection, user_id: &str) -> QueryResult<bool> {
    Ok(users::table
        .find(user_id)
        .select(users::shadow_banned)
        .first::<bool>(&mut conn)
        .await
        .optional()?
        .unwrap_or(false))
}

/// Sets or clears a user's shadow ban; returns false for unknown users.
pub async fn set_shadow_banned(
    mut conn: &AsyncPgConnection,
    user_id: &str,
    banned: bool,
) -> QueryResult<bool> {
    Ok(diesel::update(users::table.find(user_id))
        .set(users::shadow_banned.eq(banned))
        .execute(&mut conn)
        .await?
        > 0)
}

/// A user directory hit.
#[derive(Debug, diesel::QueryableByName)]
pub struct DirectoryUser {
    /// User ID.
    #[diesel(sql_type = diesel::sql_types::Text)]
    pub user_id: String,
    /// Display name.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub displayname: Option<String>,
    /// Avatar URL.
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub avatar_url: Option<String>,
}

/// Users matching `term` (in ID or display name) whom `searcher` may discover: those sharing a
/// joined room with them, or joined to a room published in the directory.
pub async fn search_user_directory(
    mut conn: &AsyncPgConnection,
    searcher: &str,
    term: &str,
    limit: i64,
) -> QueryResult<Vec<DirectoryUser>> {
    crate::storage::cached_sql(
        "SELECT u.user_id, dn.value #>> '{}' AS displayname, av.value #>> '{}' AS avatar_url \
         FROM users u \
         LEFT JOIN profile_fields dn ON dn.user_id = u.user_id AND dn.field_name = 'displayname' \
         LEFT JOIN profile_fields av ON av.user_id = u.user_id AND av.field_name = 'avatar_url' \
         WHERE NOT u.deactivated \
           AND (u.user_id ILIKE $1 OR dn.value #>> '{}' ILIKE $1) \
           AND (u.user_id = $2 \
                OR EXISTS (SELECT 1 FROM room_memberships a JOIN room_memberships b ON a.room_id = b.room_id \
                           WHERE a.user_id = u.user_id AND a.membership = 'join' \
                             AND b.user_id = $2 AND b.membership = 'join') \
                OR EXISTS (SELECT 1 FROM room_memberships a JOIN rooms r ON r.room_id = a.room_id \
                           WHERE a.user_id = u.user_id AND a.membership = 'join' AND r.is_public)) \
         ORDER BY u.user_id LIMIT $3",
    )
    .bind::<diesel::sql_types::Text, _>(crate::storage::like_contains(term))
    .bind::<diesel::sql_types::Text, _>(searcher)
    .bind::<diesel::sql_types::BigInt, _>(limit)
    .load(&mut conn)
    .await
}
