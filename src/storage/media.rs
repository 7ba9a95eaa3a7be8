//! Media metadata and thumbnails.

use diesel::prelude::*;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use super::schema::{media, media_thumbnails, remote_media, remote_media_thumbnails};

/// A media item.
#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = media)]
pub struct MediaRow {
    /// The ID in `mxc://server/ID`.
    pub media_id: String,
    /// Who uploaded (or reserved) it.
    pub uploader: String,
    /// Declared content type.
    pub content_type: Option<String>,
    /// Declared file name.
    pub filename: Option<String>,
    /// Size in bytes (`None` while pending).
    pub size: Option<i64>,
    /// SHA-256 of the bytes, hex (`None` while pending).
    pub sha256: Option<String>,
    /// When it was created.
    pub created_ts: i64,
    /// When a pending ID expires.
    pub expires_ts: Option<i64>,
    /// The admin who quarantined it (then it is served to nobody).
    pub quarantined_by: Option<String>,
}

/// A stored thumbnail.
#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = media_thumbnails)]
pub struct ThumbnailRow {
    /// Media it belongs to.
    pub media_id: String,
    /// Requested box width.
    pub width: i32,
    /// Requested box height.
    pub height: i32,
    /// `crop` or `scale`.
    pub method: String,
    /// Content type of the thumbnail.
    pub content_type: String,
    /// SHA-256 of its bytes, hex.
    pub sha256: String,
    /// Size in bytes.
    pub size: i64,
}

/// Stores a new media row.
pub async fn insert_media(mut conn: &AsyncPgConnection, row: &MediaRow) -> QueryResult<()> {
    diesel::insert_into(media::table)
        .values(row)
        .execute(&mut conn)
        .await
        .map(drop)
}

/// One media row.
pub async fn get_media(
    mut conn: &AsyncPgConnection,
    media_id: &str,
) -> QueryResult<Option<MediaRow>> {
    media::table
        .find(media_id)
        .select(MediaRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Fills in a pending upload; false when it was not pending any more (uploaded already).
pub async fn complete_pending(
    mut conn: &AsyncPgConnection,
    media_id: &str,
    content_type: Option<&str>,
    filename: Option<&str>,
    size: i64,
    sha256: &str,
) -> QueryResult<bool> {
    diesel::update(media::table.find(media_id).filter(media::sha256.is_null()))
        .set((
            media::content_type.eq(content_type),
            media::filename.eq(filename),
            media::size.eq(size),
            media::sha256.eq(sha256),
            media::expires_ts.eq(None::<i64>),
        ))
        .execute(&mut conn)
        .await
        .map(|n| n == 1)
}

/// How many pending IDs a user holds that have not expired.
pub async fn count_pending(
    mut conn: &AsyncPgConnection,
    uploader: &str,
    now: i64,
) -> QueryResult<i64> {
    media::table
        .filter(media::uploader.eq(uploader))
        .filter(media::sha256.is_null())
        .filter(media::expires_ts.gt(now))
        .count()
        .get_result(&mut conn)
        .await
}

/// Column a media list is ordered by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaOrder {
    /// Upload time.
    CreatedTs,
    /// Media ID.
    MediaId,
    /// File name.
    UploadName,
    /// Size.
    MediaLength,
    /// Content type.
    MediaType,
    /// The quarantining admin.
    QuarantinedBy,
}

/// A page of the media a user uploaded (pending IDs left out) and how many there are.
pub async fn list_user_media(
    mut conn: &AsyncPgConnection,
    uploader: &str,
    (order, descending): (MediaOrder, bool),
    from: i64,
    limit: i64,
) -> QueryResult<(Vec<MediaRow>, i64)> {
    let mine = || {
        media::table
            .filter(media::uploader.eq(uploader))
            .filter(media::sha256.is_not_null())
    };
    let mut page = mine().select(MediaRow::as_select()).into_boxed();
    page = match (order, descending) {
        (MediaOrder::CreatedTs, false) => page.order(media::created_ts.asc()),
        (MediaOrder::CreatedTs, true) => page.order(media::created_ts.desc()),
        (MediaOrder::MediaId, false) => page.order(media::media_id.asc()),
        (MediaOrder::MediaId, true) => page.order(media::media_id.desc()),
        (MediaOrder::UploadName, false) => page.order(media::filename.asc()),
        (MediaOrder::UploadName, true) => page.order(media::filename.desc()),
        (MediaOrder::MediaLength, false) => page.order(media::size.asc()),
        (MediaOrder::MediaLength, true) => page.order(media::size.desc()),
        (MediaOrder::MediaType, false) => page.order(media::content_type.asc()),
        (MediaOrder::MediaType, true) => page.order(media::content_type.desc()),
        (MediaOrder::QuarantinedBy, false) => page.order(media::quarantined_by.asc()),
        (MediaOrder::QuarantinedBy, true) => page.order(media::quarantined_by.desc()),
    };
    let rows = page
        .then_order_by(media::media_id.asc())
        .offset(from)
        .limit(limit)
        .load(&mut conn)
        .await?;
    let total = mine().count().get_result(&mut conn).await?;
    Ok((rows, total))
}

/// Quarantines a media item (or lifts it with `None`); false when there is no such item.
pub async fn set_quarantined(
    mut conn: &AsyncPgConnection,
    media_id: &str,
    quarantined_by: Option<&str>,
) -> QueryResult<bool> {
    Ok(diesel::update(media::table.find(media_id))
        .set(media::quarantined_by.eq(quarantined_by))
        .execute(&mut conn)
        .await?
        > 0)
}

/// Deletes a media item and its thumbnails; returns the content hashes they used, or `None`
/// when there was no such item.
pub async fn delete_media(
    mut conn: &AsyncPgConnection,
    media_id: &str,
) -> QueryResult<Option<Vec<String>>> {
    let mut hashes: Vec<String> =
        diesel::delete(media_thumbnails::table.filter(media_thumbnails::media_id.eq(media_id)))
            .returning(media_thumbnails::sha256)
            .get_results(&mut conn)
            .await?;
    let Some(sha256) = diesel::delete(media::table.find(media_id))
        .returning(media::sha256)
        .get_result::<Option<String>>(&mut conn)
        .await
        .optional()?
    else {
        return Ok(None);
    };
    hashes.extend(sha256);
    Ok(Some(hashes))
}

/// Whether any media item or thumbnail, local or cached remote, still uses these bytes
/// (content is stored once per hash).
pub async fn is_content_used(mut conn: &AsyncPgConnection, sha256: &str) -> QueryResult<bool> {
    diesel::select(
        diesel::dsl::exists(media::table.filter(media::sha256.eq(sha256)))
            .or(diesel::dsl::exists(
                media_thumbnails::table.filter(media_thumbnails::sha256.eq(sha256)),
            ))
            .or(diesel::dsl::exists(
                remote_media::table.filter(remote_media::sha256.eq(sha256)),
            ))
            .or(diesel::dsl::exists(
                remote_media_thumbnails::table.filter(remote_media_thumbnails::sha256.eq(sha256)),
            )),
    )
    .get_result(&mut conn)
    .await
}

/// A stored thumbnail.
pub async fn get_thumbnail(
    mut conn: &AsyncPgConnection,
    media_id: &str,
    width: i32,
    height: i32,
    method: &str,
) -> QueryResult<Option<ThumbnailRow>> {
    media_thumbnails::table
        .find((media_id, width, height, method))
        .select(ThumbnailRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Stores a thumbnail (a concurrent twin is fine: the first one stays).
pub async fn insert_thumbnail(mut conn: &AsyncPgConnection, row: &ThumbnailRow) -> QueryResult<()> {
    diesel::insert_into(media_thumbnails::table)
        .values(row)
        .on_conflict_do_nothing()
        .execute(&mut conn)
        .await
        .map(drop)
}

/// A cached media item of another server.
#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = remote_media)]
pub struct RemoteMediaRow {
    /// The server in `mxc://server/ID`.
    pub origin: String,
    /// The ID in `mxc://server/ID`.
    pub media_id: String,
    /// Content type the server gave.
    pub content_type: Option<String>,
    /// File name the server gave.
    pub filename: Option<String>,
    /// Size in bytes.
    pub size: i64,
    /// SHA-256 of the bytes, hex.
    pub sha256: String,
    /// When it was fetched.
    pub fetched_ts: i64,
}

/// A cached thumbnail of another server's media.
#[derive(Debug, Clone, Queryable, Selectable, Insertable)]
#[diesel(table_name = remote_media_thumbnails)]
pub struct RemoteThumbnailRow {
    /// The media's server.
    pub origin: String,
    /// The media's ID.
    pub media_id: String,
    /// Requested box width (a standard size).
    pub width: i32,
    /// Requested box height (a standard size).
    pub height: i32,
    /// `crop` or `scale`.
    pub method: String,
    /// Content type of the thumbnail.
    pub content_type: String,
    /// SHA-256 of its bytes, hex.
    pub sha256: String,
    /// Size in bytes.
    pub size: i64,
}

/// A cached remote media item.
pub async fn get_remote_media(
    mut conn: &AsyncPgConnection,
    origin: &str,
    media_id: &str,
) -> QueryResult<Option<RemoteMediaRow>> {
    remote_media::table
        .find((origin, media_id))
        .select(RemoteMediaRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Caches a remote media item (a concurrent fetch of the same one is fine: the first stays).
pub async fn insert_remote_media(
    mut conn: &AsyncPgConnection,
    row: &RemoteMediaRow,
) -> QueryResult<()> {
    diesel::insert_into(remote_media::table)
        .values(row)
        .on_conflict_do_nothing()
        .execute(&mut conn)
        .await
        .map(drop)
}

/// A cached thumbnail of remote media.
pub async fn get_remote_thumbnail(
    mut conn: &AsyncPgConnection,
    (origin, media_id): (&str, &str),
    width: i32,
    height: i32,
    method: &str,
) -> QueryResult<Option<RemoteThumbnailRow>> {
    remote_media_thumbnails::table
        .find((origin, media_id, width, height, method))
        .select(RemoteThumbnailRow::as_select())
        .first(&mut conn)
        .await
        .optional()
}

/// Caches a thumbnail of remote media (the first of concurrent twins stays).
pub async fn insert_remote_thumbnail(
    mut conn: &AsyncPgConnection,
    row: &RemoteThumbnailRow,
) -> QueryResult<()> {
    diesel::insert_into(remote_media_thumbnails::table)
        .values(row)
        .on_conflict_do_nothing()
        .execute(&mut conn)
        .await
        .map(drop)
}
