//! `GET /_matrix/federation/v1/media/download/{mediaId}` and `/thumbnail/{mediaId}`: our own
//! media for other servers, as `multipart/mixed` (JSON metadata, then the bytes).

use actix_web::web::Data;
use ruma::{
    api::federation::authenticated_media::{
        get_content, get_content_thumbnail, Content, ContentMetadata, FileOrLocation,
    },
    http_headers::{ContentDisposition, ContentDispositionType},
};

use crate::{
    api::{
        client::media::is_inline,
        ruma::{Ruma, RumaResponse},
    },
    error::{Error, Result},
    service::{
        media::{imaging::Method, Download},
        Services,
    },
};

/// The bytes of a download with their type and disposition.
async fn file(download: Download) -> Result<FileOrLocation> {
    let bytes = tokio::fs::read(&download.path)
        .await
        .map_err(Error::internal)?;
    let disposition = ContentDisposition::new(if is_inline(&download.content_type) {
        ContentDispositionType::Inline
    } else {
        ContentDispositionType::Attachment
    })
    .with_filename(download.filename);
    Ok(FileOrLocation::File(Content::new(
        bytes,
        download.content_type,
        disposition,
    )))
}

/// `GET /_matrix/federation/v1/media/download/{mediaId}`: local media only.
pub async fn media_download_route(
    services: Data<Services>,
    body: Ruma<get_content::v1::Request>,
) -> Result<RumaResponse<get_content::v1::Response>> {
    body.origin()?;
    let download = services
        .media
        .download(
            services.config.server_name.as_str(),
            &body.body.media_id,
            false,
        )
        .await?;
    Ok(get_content::v1::Response::new(ContentMetadata::new(), file(download).await?).into())
}

/// `GET /_matrix/federation/v1/media/thumbnail/{mediaId}`: local media only.
pub async fn media_thumbnail_route(
    services: Data<Services>,
    body: Ruma<get_content_thumbnail::v1::Request>,
) -> Result<RumaResponse<get_content_thumbnail::v1::Response>> {
    body.origin()?;
    let r = &body.body;
    let method = match r.method {
        Some(ruma::media::Method::Crop) => Method::Crop,
        _ => Method::Scale,
    };
    let download = services
        .media
        .thumbnail(
            services.config.server_name.as_str(),
            &r.media_id,
            u32::try_from(r.width).unwrap_or(u32::MAX),
            u32::try_from(r.height).unwrap_or(u32::MAX),
            method,
            false,
        )
        .await?;
    Ok(
        get_content_thumbnail::v1::Response::new(ContentMetadata::new(), file(download).await?)
            .into(),
    )
}
