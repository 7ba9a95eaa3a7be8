//! The media repository: uploads streamed to disk and stored once per distinct content,
//! authenticated downloads, thumbnails and BlurHash placeholders.
//!
//! Bytes live under `{data_dir}/media/{aa}/{bb}/{sha256}`; an upload is written to a temporary
//! file while it is hashed, then renamed into place, so a crash never leaves a half-written
//! file under a live ID. PostgreSQL holds who uploaded what, under which type and name.

mod admin;
pub mod imaging;
mod remote;

use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{Arc, Mutex},
};

use futures_util::{Stream, StreamExt};
use rand::{distr::Alphanumeric, Rng};
use sha2::{Digest, Sha256};
use tokio::{
    io::AsyncWriteExt,
    sync::{OwnedMutexGuard, Semaphore},
};

use self::imaging::Method;
use crate::{
    config::Config,
    error::{Error, Result},
    service::federation::FederationClient,
    storage::{
        media::{self as store, MediaRow, ThumbnailRow},
        now_ms, Db,
    },
};

/// How long an ID from `/media/v1/create` waits for its upload.
const PENDING_LIFETIME_MS: i64 = 24 * 60 * 60 * 1000;
/// Pending IDs a user may hold at once (as Synapse).
const MAX_PENDING_PER_USER: i64 = 50;
/// Images larger than this get no thumbnail or BlurHash (decoding them costs too much).
const MAX_IMAGE_BYTES: u64 = 32 * 1024 * 1024;

/// A stored upload.
struct Stored {
    sha256: String,
    size: u64,
}

/// What a download serves.
pub struct Download {
    /// The file on disk.
    pub path: PathBuf,
    /// Its content type.
    pub content_type: String,
    /// Its file name, when the uploader gave one.
    pub filename: Option<String>,
}

/// What an upload answers.
pub struct Uploaded {
    /// `mxc://server/id`.
    pub content_uri: String,
    /// A BlurHash for images (MSC2448).
    pub blurhash: Option<String>,
}

fn not_found() -> Error {
    Error::not_found("Media not found")
}

fn cannot_thumbnail() -> Error {
    Error::matrix(
        actix_web::http::StatusCode::BAD_REQUEST,
        "M_UNKNOWN",
        "Cannot generate a thumbnail of this media",
    )
}

/// A thumbnail being made: media ID, width, height, method.
type ThumbnailKey = (String, u32, u32, Method);

/// One gate per thumbnail being made, so concurrent requests for it wait for the first
/// instead of decoding the same image again.
#[derive(Default)]
struct Flights(Mutex<HashMap<ThumbnailKey, Arc<tokio::sync::Mutex<()>>>>);

/// A turn at making one thumbnail; the gate is dropped from the map with its last user.
struct FlightTurn<'a> {
    flights: &'a Flights,
    key: ThumbnailKey,
    guard: Option<OwnedMutexGuard<()>>,
}

impl Flights {
    async fn turn(&self, key: ThumbnailKey) -> FlightTurn<'_> {
        let gate = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .clone();
        FlightTurn {
            flights: self,
            key,
            guard: Some(gate.lock_owned().await),
        }
    }
}

impl Drop for FlightTurn<'_> {
    fn drop(&mut self) {
        let mut map = self.flights.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(guard) = self.guard.take() {
            let gate = OwnedMutexGuard::mutex(&guard).clone();
            drop(guard);
            // Only the map and `gate` left: nobody is waiting (they clone under this lock).
            if Arc::strong_count(&gate) == 2 {
                map.remove(&self.key);
            }
        }
    }
}

/// The media service.
pub struct Media {
    db: Db,
    config: Arc<Config>,
    /// Fetches media of other servers.
    federation: Arc<FederationClient>,
    root: PathBuf,
    /// Image decodes running at once (one per core): each may take hundreds of MiB.
    decodes: Arc<Semaphore>,
    flights: Flights,
}

impl Media {
    /// Creates the service.
    pub fn new(db: Db, config: Arc<Config>, federation: Arc<FederationClient>) -> Self {
        let root = config.data_dir.join("media");
        // Uploads may be private attachments: other local users must not read them.
        let private = std::fs::create_dir_all(&root).and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
        });
        if let Err(err) = private {
            tracing::warn!("cannot make {} private (0700): {err}", root.display());
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Media {
            db,
            config,
            federation,
            root,
            decodes: Arc::new(Semaphore::new(cores)),
            flights: Flights::default(),
        }
    }

    /// Decodes `bytes` on a blocking thread once a decode permit is free and runs `work` on
    /// the image. The permit travels with the thread, so an abandoned request cannot let
    /// more decodes run than there are permits.
    async fn with_decoded<T: Send + 'static>(
        &self,
        bytes: Vec<u8>,
        work: impl FnOnce(image::DynamicImage) -> Result<T, String> + Send + 'static,
    ) -> Result<Result<T, String>> {
        let permit = self
            .decodes
            .clone()
            .acquire_owned()
            .await
            .map_err(Error::internal)?;
        let max_pixels = self.config.max_image_pixels;
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            imaging::decode(&bytes, max_pixels).and_then(work)
        })
        .await
        .map_err(Error::internal)
    }

    /// Largest upload in bytes.
    pub fn max_upload_size(&self) -> u64 {
        self.config.max_upload_size
    }

    fn path_of(&self, sha256: &str) -> PathBuf {
        self.root
            .join(&sha256[..2])
            .join(&sha256[2..4])
            .join(sha256)
    }

    fn mxc(&self, media_id: &str) -> String {
        format!("mxc://{}/{media_id}", self.config.server_name)
    }

    /// Streams a body to a temporary file, hashing it and enforcing the size limit, then
    /// moves it into place (or drops it when the same bytes are already stored).
    async fn store<S, E>(&self, body: S) -> Result<Stored>
    where
        S: Stream<Item = std::result::Result<actix_web::web::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let tmp_dir = self.root.join("tmp");
        tokio::fs::create_dir_all(&tmp_dir)
            .await
            .map_err(Error::internal)?;
        let name: String = rand::rng()
            .sample_iter(&Alphanumeric)
            .take(16)
            .map(char::from)
            .collect();
        let tmp = tmp_dir.join(name);
        let result = self.write_tmp(&tmp, body).await;
        let stored = match result {
            Ok(stored) => stored,
            Err(err) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(err);
            }
        };
        let path = self.path_of(&stored.sha256);
        let metrics = crate::metrics::metrics();
        metrics
            .media_bytes
            .get_or_create(&crate::metrics::Kind { kind: "in" })
            .inc_by(stored.size);
        if tokio::fs::try_exists(&path).await.unwrap_or(false) {
            // Stored once: the same bytes uploaded again share the file.
            let _ = tokio::fs::remove_file(&tmp).await;
            crate::metrics::Metrics::count(&metrics.media_uploads, "deduplicated");
        } else {
            crate::metrics::Metrics::count(&metrics.media_uploads, "stored");
            let dir = path.parent().expect("media paths have a parent");
            tokio::fs::create_dir_all(dir)
                .await
                .map_err(Error::internal)?;
            tokio::fs::rename(&tmp, &path)
                .await
                .map_err(Error::internal)?;
        }
        Ok(stored)
    }

    async fn write_tmp<S, E>(&self, tmp: &PathBuf, mut body: S) -> Result<Stored>
    where
        S: Stream<Item = std::result::Result<actix_web::web::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let mut file = tokio::fs::File::create(tmp)
            .await
            .map_err(Error::internal)?;
        let mut hasher = Sha256::new();
        let mut size: u64 = 0;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| Error::bad_json(format!("Upload interrupted: {e}")))?;
            size += chunk.len() as u64;
            if size > self.config.max_upload_size {
                return Err(Error::too_large(format!(
                    "Uploads are limited to {} bytes",
                    self.config.max_upload_size
                )));
            }
            hasher.update(&chunk);
            file.write_all(&chunk).await.map_err(Error::internal)?;
        }
        file.sync_all().await.map_err(Error::internal)?;
        Ok(Stored {
            sha256: hex::encode(hasher.finalize()),
            size,
        })
    }

    fn new_media_id() -> String {
        rand::rng()
            .sample_iter(&Alphanumeric)
            .take(24)
            .map(char::from)
            .collect()
    }

    /// `POST /_matrix/media/v3/upload`.
    pub async fn upload<S, E>(
        &self,
        uploader: &str,
        content_type: Option<&str>,
        filename: Option<&str>,
        body: S,
    ) -> Result<Uploaded>
    where
        S: Stream<Item = std::result::Result<actix_web::web::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        let stored = self.store(body).await?;
        let media_id = Self::new_media_id();
        let conn = self.db.conn().await?;
        store::insert_media(
            &conn,
            &MediaRow {
                media_id: media_id.clone(),
                uploader: uploader.to_owned(),
                content_type: content_type.map(str::to_owned),
                filename: filename.map(str::to_owned),
                size: Some(stored.size as i64),
                sha256: Some(stored.sha256.clone()),
                created_ts: now_ms(),
                expires_ts: None,
                quarantined_by: None,
            },
        )
        .await?;
        Ok(Uploaded {
            content_uri: self.mxc(&media_id),
            blurhash: self.blurhash_of(content_type, &stored).await,
        })
    }

    /// `POST /_matrix/media/v1/create`: reserves an ID for a later upload.
    pub async fn create(&self, uploader: &str) -> Result<(String, i64)> {
        let now = now_ms();
        let conn = self.db.conn().await?;
        if store::count_pending(&conn, uploader, now).await? >= MAX_PENDING_PER_USER {
            return Err(Error::limit_exceeded(60_000));
        }
        let media_id = Self::new_media_id();
        let expires = now + PENDING_LIFETIME_MS;
        store::insert_media(
            &conn,
            &MediaRow {
                media_id: media_id.clone(),
                uploader: uploader.to_owned(),
                content_type: None,
                filename: None,
                size: None,
                sha256: None,
                created_ts: now,
                expires_ts: Some(expires),
                quarantined_by: None,
            },
        )
        .await?;
        Ok((self.mxc(&media_id), expires))
    }

    /// `PUT /_matrix/media/v3/upload/{serverName}/{mediaId}`: only by whoever created the
    /// ID, only once, only before it expires.
    pub async fn upload_pending<S, E>(
        &self,
        uploader: &str,
        server_name: &str,
        media_id: &str,
        content_type: Option<&str>,
        filename: Option<&str>,
        body: S,
    ) -> Result<Option<String>>
    where
        S: Stream<Item = std::result::Result<actix_web::web::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        if server_name != self.config.server_name.as_str() {
            return Err(Error::forbidden(
                "Media IDs of other servers cannot be uploaded to",
            ));
        }
        let conn = self.db.conn().await?;
        let row = store::get_media(&conn, media_id)
            .await?
            .ok_or_else(not_found)?;
        if row.uploader != uploader {
            return Err(Error::forbidden("This media ID belongs to someone else"));
        }
        let cannot_overwrite = || {
            Error::matrix(
                actix_web::http::StatusCode::CONFLICT,
                "M_CANNOT_OVERWRITE_MEDIA",
                "This media has already been uploaded",
            )
        };
        if row.sha256.is_some() {
            return Err(cannot_overwrite());
        }
        if row.expires_ts.is_some_and(|at| at <= now_ms()) {
            return Err(Error::not_found("This media ID has expired"));
        }
        drop(conn);
        let stored = self.store(body).await?;
        let conn = self.db.conn().await?;
        if !store::complete_pending(
            &conn,
            media_id,
            content_type,
            filename,
            stored.size as i64,
            &stored.sha256,
        )
        .await?
        {
            return Err(cannot_overwrite());
        }
        Ok(self.blurhash_of(content_type, &stored).await)
    }

    /// A local media item ready to serve. `legacy`: through the unauthenticated endpoints,
    /// which serve only media from before the configured freeze.
    async fn ready(&self, server_name: &str, media_id: &str, legacy: bool) -> Result<MediaRow> {
        if server_name != self.config.server_name.as_str() {
            return Err(not_found());
        }
        let conn = self.db.conn().await?;
        let row = store::get_media(&conn, media_id)
            .await?
            .ok_or_else(not_found)?;
        // Quarantined media is gone for everyone, thumbnails included (as in Synapse).
        if row.quarantined_by.is_some()
            || (legacy && row.created_ts as u64 >= self.config.legacy_media_until_ms)
        {
            return Err(not_found());
        }
        if row.sha256.is_none() {
            return Err(Error::matrix(
                actix_web::http::StatusCode::GATEWAY_TIMEOUT,
                "M_NOT_YET_UPLOADED",
                "The media has not been uploaded yet",
            ));
        }
        Ok(row)
    }

    /// The file of a media item.
    pub async fn download(
        &self,
        server_name: &str,
        media_id: &str,
        legacy: bool,
    ) -> Result<Download> {
        if server_name != self.config.server_name.as_str() {
            return self.remote_download(server_name, media_id, legacy).await;
        }
        let row = self.ready(server_name, media_id, legacy).await?;
        let metrics = crate::metrics::metrics();
        metrics.media_downloads.inc();
        metrics
            .media_bytes
            .get_or_create(&crate::metrics::Kind { kind: "out" })
            .inc_by(row.size.unwrap_or(0).max(0) as u64);
        Ok(Download {
            path: self.path_of(row.sha256.as_deref().unwrap_or_default()),
            content_type: row
                .content_type
                .unwrap_or_else(|| "application/octet-stream".into()),
            filename: row.filename,
        })
    }

    /// A thumbnail at the standard size serving the request, made on first request.
    pub async fn thumbnail(
        &self,
        server_name: &str,
        media_id: &str,
        width: u32,
        height: u32,
        method: Method,
        legacy: bool,
    ) -> Result<Download> {
        if width == 0 || height == 0 {
            return Err(Error::invalid_param("width and height must be positive"));
        }
        let (w, h, method) = imaging::standard_size(width, height, method);
        if server_name != self.config.server_name.as_str() {
            return self
                .remote_thumbnail(server_name, media_id, (w, h, method), legacy)
                .await;
        }
        let row = self.ready(server_name, media_id, legacy).await?;
        if let Some(made) = self.stored_thumbnail(media_id, w, h, method).await? {
            return Ok(made);
        }
        let content_type = row.content_type.clone().unwrap_or_default();
        if !imaging::is_decodable(&content_type) || row.size.unwrap_or(0) as u64 > MAX_IMAGE_BYTES {
            return Err(cannot_thumbnail());
        }
        let _turn = self.flights.turn((media_id.to_owned(), w, h, method)).await;
        // Whoever held the turn before us may have made it.
        if let Some(made) = self.stored_thumbnail(media_id, w, h, method).await? {
            return Ok(made);
        }
        let source = self.path_of(row.sha256.as_deref().unwrap_or_default());
        let bytes = tokio::fs::read(&source).await.map_err(Error::internal)?;
        let thumb = self
            .with_decoded(bytes, move |image| {
                imaging::thumbnail(&image, &content_type, w, h, method)
            })
            .await?
            .map_err(|err| {
                tracing::info!(%media_id, "no thumbnail: {err}");
                cannot_thumbnail()
            })?;
        let stored = self
            .store(futures_util::stream::iter([Ok::<
                _,
                std::convert::Infallible,
            >(
                actix_web::web::Bytes::from(thumb.bytes),
            )]))
            .await?;
        let conn = self.db.conn().await?;
        store::insert_thumbnail(
            &conn,
            &ThumbnailRow {
                media_id: media_id.to_owned(),
                width: w as i32,
                height: h as i32,
                method: method.as_str().to_owned(),
                content_type: thumb.content_type.to_owned(),
                sha256: stored.sha256.clone(),
                size: stored.size as i64,
            },
        )
        .await?;
        Ok(Download {
            path: self.path_of(&stored.sha256),
            content_type: thumb.content_type.to_owned(),
            filename: None,
        })
    }

    /// The thumbnail of this size if it was made already.
    async fn stored_thumbnail(
        &self,
        media_id: &str,
        w: u32,
        h: u32,
        method: Method,
    ) -> Result<Option<Download>> {
        let conn = self.db.conn().await?;
        let thumb =
            store::get_thumbnail(&conn, media_id, w as i32, h as i32, method.as_str()).await?;
        Ok(thumb.map(|thumb| Download {
            path: self.path_of(&thumb.sha256),
            content_type: thumb.content_type,
            filename: None,
        }))
    }

    /// A BlurHash for an uploaded image; `None` for anything else or an image that does not
    /// decode or is too large (a broken image is still a valid upload).
    async fn blurhash_of(&self, content_type: Option<&str>, stored: &Stored) -> Option<String> {
        if !content_type.is_some_and(imaging::is_decodable) || stored.size > MAX_IMAGE_BYTES {
            return None;
        }
        let bytes = tokio::fs::read(self.path_of(&stored.sha256)).await.ok()?;
        self.with_decoded(bytes, |image| Ok(imaging::blurhash(&image)))
            .await
            .ok()?
            .ok()
            .flatten()
    }
}
