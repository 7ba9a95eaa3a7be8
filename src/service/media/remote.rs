//! Media of other servers: fetched through the authenticated federation endpoints on a
//! client's request, kept in the local store keyed by `(server, media ID)` and served from
//! there afterwards without asking the server again. Thumbnails are asked of the server at our
//! standard sizes and kept the same way.

use actix_web::web::Bytes;
use ruma::{
    api::federation::authenticated_media::{
        get_content, get_content_thumbnail, Content, FileOrLocation,
    },
    ServerName, UInt,
};

use super::{imaging::Method, not_found, Download, Media};
use crate::{
    error::{Error, Result},
    service::federation::{query::client_error, FederationError},
    storage::{
        media::{self as store, RemoteMediaRow, RemoteThumbnailRow},
        now_ms,
    },
};

/// Room for the multipart framing around the largest file accepted.
const MULTIPART_OVERHEAD: usize = 64 * 1024;

/// The error for a failed fetch: the remote's 404 is ours, anything else a gateway error.
fn fetch_error(err: FederationError) -> Error {
    client_error(err, "media")
}

impl Media {
    /// A remote media item, from the cache or fetched from `origin`. `legacy`: through the
    /// unauthenticated endpoints, which serve only what was cached before the freeze and fetch
    /// nothing after it.
    pub(super) async fn remote_download(
        &self,
        origin: &str,
        media_id: &str,
        legacy: bool,
    ) -> Result<Download> {
        let origin = ServerName::parse(origin).map_err(|_| not_found())?;
        let frozen = |ts: i64| legacy && ts as u64 >= self.config.legacy_media_until_ms;
        if let Some(row) = self.cached(&origin, media_id).await? {
            return if frozen(row.fetched_ts) {
                Err(not_found())
            } else {
                Ok(self.remote_file(row))
            };
        }
        if frozen(now_ms()) {
            return Err(not_found());
        }
        let _turn = self
            .flights
            .turn((format!("{origin}/{media_id}"), 0, 0, Method::Scale))
            .await;
        // Whoever fetched before us may have stored it.
        if let Some(row) = self.cached(&origin, media_id).await? {
            return Ok(self.remote_file(row));
        }
        let request = get_content::v1::Request::new(media_id.to_owned());
        let response = self
            .federation
            .send_limited(&origin, request, self.remote_limit())
            .await
            .map_err(fetch_error)?;
        let content = self.file_of(&origin, response.content)?;
        let filename = content
            .content_disposition
            .as_ref()
            .and_then(|d| d.filename.clone());
        let content_type = content.content_type.clone();
        let stored = self.store_bytes(content.file).await?;
        let row = RemoteMediaRow {
            origin: origin.to_string(),
            media_id: media_id.to_owned(),
            content_type,
            filename,
            size: stored.size as i64,
            sha256: stored.sha256,
            fetched_ts: now_ms(),
        };
        let conn = self.db.conn().await?;
        store::insert_remote_media(&conn, &row).await?;
        Ok(self.remote_file(row))
    }

    /// A thumbnail of remote media at the standard size serving the request, from the cache
    /// or asked of `origin`.
    pub(super) async fn remote_thumbnail(
        &self,
        origin: &str,
        media_id: &str,
        (w, h, method): (u32, u32, Method),
        legacy: bool,
    ) -> Result<Download> {
        let origin = ServerName::parse(origin).map_err(|_| not_found())?;
        if legacy && now_ms() as u64 >= self.config.legacy_media_until_ms {
            // Thumbnails carry no fetch time; after the freeze only the download of media
            // cached before it is served unauthenticated.
            return Err(not_found());
        }
        let key = (origin.as_str(), media_id);
        if let Some(made) = self.cached_thumbnail(key, w, h, method).await? {
            return Ok(made);
        }
        let _turn = self
            .flights
            .turn((format!("{origin}/{media_id}"), w, h, method))
            .await;
        if let Some(made) = self.cached_thumbnail(key, w, h, method).await? {
            return Ok(made);
        }
        let mut request = get_content_thumbnail::v1::Request::new(
            media_id.to_owned(),
            UInt::from(w),
            UInt::from(h),
        );
        request.method = Some(match method {
            Method::Crop => ruma::media::Method::Crop,
            Method::Scale => ruma::media::Method::Scale,
        });
        let response = self
            .federation
            .send_limited(&origin, request, self.remote_limit())
            .await
            .map_err(fetch_error)?;
        let content = self.file_of(&origin, response.content)?;
        let content_type = content
            .content_type
            .clone()
            .unwrap_or_else(|| "application/octet-stream".into());
        let stored = self.store_bytes(content.file).await?;
        let conn = self.db.conn().await?;
        store::insert_remote_thumbnail(
            &conn,
            &RemoteThumbnailRow {
                origin: origin.to_string(),
                media_id: media_id.to_owned(),
                width: w as i32,
                height: h as i32,
                method: method.as_str().to_owned(),
                content_type: content_type.clone(),
                sha256: stored.sha256.clone(),
                size: stored.size as i64,
            },
        )
        .await?;
        Ok(Download {
            path: self.path_of(&stored.sha256),
            content_type,
            filename: None,
        })
    }

    /// The largest answer read from another server: the upload limit plus multipart framing.
    fn remote_limit(&self) -> usize {
        usize::try_from(self.config.max_upload_size)
            .unwrap_or(usize::MAX)
            .saturating_add(MULTIPART_OVERHEAD)
    }

    /// The bytes of a federation media answer, within the upload limit. A redirect to a
    /// `Location` is not followed (Myelin and Synapse answer with the bytes).
    fn file_of(&self, origin: &ServerName, content: FileOrLocation) -> Result<Content> {
        let gateway = |message: String| {
            Error::matrix(
                actix_web::http::StatusCode::BAD_GATEWAY,
                "M_UNKNOWN",
                message,
            )
        };
        match content {
            FileOrLocation::File(content) => {
                if content.file.len() as u64 > self.config.max_upload_size {
                    return Err(gateway(format!(
                        "The media on {origin} is larger than {} bytes",
                        self.config.max_upload_size
                    )));
                }
                Ok(content)
            }
            _ => Err(gateway(format!(
                "{origin} answered with a redirect, which is not followed"
            ))),
        }
    }

    /// Stores bytes fetched in full.
    async fn store_bytes(&self, bytes: Vec<u8>) -> Result<super::Stored> {
        self.store(futures_util::stream::iter([Ok::<
            _,
            std::convert::Infallible,
        >(Bytes::from(bytes))]))
            .await
    }

    async fn cached(&self, origin: &ServerName, media_id: &str) -> Result<Option<RemoteMediaRow>> {
        let conn = self.db.conn().await?;
        Ok(store::get_remote_media(&conn, origin.as_str(), media_id).await?)
    }

    async fn cached_thumbnail(
        &self,
        key: (&str, &str),
        w: u32,
        h: u32,
        method: Method,
    ) -> Result<Option<Download>> {
        let conn = self.db.conn().await?;
        let thumb =
            store::get_remote_thumbnail(&conn, key, w as i32, h as i32, method.as_str()).await?;
        Ok(thumb.map(|thumb| Download {
            path: self.path_of(&thumb.sha256),
            content_type: thumb.content_type,
            filename: None,
        }))
    }

    fn remote_file(&self, row: RemoteMediaRow) -> Download {
        Download {
            path: self.path_of(&row.sha256),
            content_type: row
                .content_type
                .unwrap_or_else(|| "application/octet-stream".into()),
            filename: row.filename,
        }
    }
}
