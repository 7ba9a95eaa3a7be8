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
pub async fn insert_user(conn: &mut AsyncPgConnection, user: &NewUser<'_>) -> QueryResult<()> {
    diesel::insert_into(users::table).values(user).execute(conn).await.map(drop)
}

/// Looks a user up by ID.
pub async fn get_user(conn: &mut AsyncPgConnection, user_id: &str) -> QueryResult<Option<UserRow>> {
    users::table
        .find(user_id)
        .select(UserRow::as_select())
        .first(conn)
        .await
        .optional()
}

/// Whether a localpart is taken (by an active or deactivated account).
pub async fn localpart_exists(conn: &mut AsyncPgConnection, localpart: &str) -> QueryResult<bool> {
    diesel::select(diesel::dsl::exists(users::table.filter(users::localpart.eq(localpart))))
        .get_result(conn)
        .await
}

/// Replaces a user's password hash (`None` removes password login).
pub async fn set_password_hash(
    conn: &mut AsyncPgConnection,
    user_id: &str,
    hash: Option<&str>,
) -> QueryResult<()> {
    diesel::update(users::table.find(user_id))
        .set(users::password_hash.eq(hash))
        .execute(conn)
        .await
        .map(drop)
}

/// Marks a user deactivated and removes their password.
pub async fn deactivate_user(conn: &mut AsyncPgConnection, user_id: &str) -> QueryResult<()> {
    diesel::update(users::table.find(user_id))
        .set((users::deactivated.eq(true), users::password_hash.eq(None::<String>)))
        .execute(conn)
        .await
        .map(drop)
}

/// All profile fields of a user.
pub async fn get_profile(conn: &mut AsyncPgConnection, user_id: &str) -> QueryResult<Vec<(String, Value)>> {
    profile_fields::table
        .filter(profile_fields::user_id.eq(user_id))
        .select((profile_fields::field_name, profile_fields::value))
        .order(profile_fields::field_name)
        .load(conn)
        .await
}

/// One profile field.
pub async fn get_profile_field(
    conn: &mut AsyncPgConnection,
    user_id: &str,
    field: &str,
) -> QueryResult<Option<Value>> {
    profile_fields::table
        .find((user_id, field))
        .select(profile_fields::value)
        .first(conn)
        .await
        .optional()
}

/// Sets one profile field.
pub async fn set_profile_field(
    conn: &mut AsyncPgConnection,
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
        .execute(conn)
        .await
        .map(drop)
}

/// Deletes one profile field (or all of them with `None`).
pub async fn delete_profile_fields(
    conn: &mut AsyncPgConnection,
    user_id: &str,
    field: Option<&str>,
) -> QueryResult<()> {
    let rows = profile_fields::table.filter(profile_fields::user_id.eq(user_id));
    match field {
        Some(field) => diesel::delete(rows.filter(profile_fields::field_name.eq(field))).execute(conn).await,
        None => diesel::delete(rows).execute(conn).await,
    }
    .map(drop)
}
