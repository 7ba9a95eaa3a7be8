//! Media: uploads (streamed, not buffered), downloads and thumbnails.

// The legacy unauthenticated endpoints are deprecated by design.
#![allow(deprecated)]

use actix_files::NamedFile;
use actix_web::{
    http::header::{
        self, Charset, ContentDisposition, DispositionParam, DispositionType, ExtendedValue,
        HeaderValue,
    },
    web::{Data, Path, Payload, Query},
    HttpRequest, HttpResponse,
};
use ruma::api::client::{
    authenticated_media::{
        get_content::v1 as download, get_content_as_filename::v1 as download_named,
        get_content_thumbnail::v1 as thumbnail, get_media_config::v1 as media_config,
        get_media_preview::v1 as preview,
    },
    media::{
        create_mxc_uri::v1 as create_mxc, get_content::v3 as legacy_download,
        get_content_as_filename::v3 as legacy_download_named,
        get_content_thumbnail::v3 as legacy_thumbnail, get_media_config::v3 as legacy_config,
        get_media_preview::v3 as legacy_preview,
    },
};
use serde::Deserialize;
use serde_json::json;

use crate::{
    api::ruma::{Authenticated, Ruma},
    error::{Error, Result},
    service::{
        media::{imaging::Method, Download},
        Services,
    },
};

/// Content types safe for a browser to render inline (as Synapse decides); anything else is
/// served as an attachment.
const INLINE_TYPES: &[&str] = &[
    "text/css",
    "text/plain",
    "text/csv",
    "application/json",
    "application/ld+json",
    "image/jpeg",
    "image/gif",
    "image/png",
    "image/apng",
    "image/webp",
    "image/avif",
    "video/mp4",
    "video/webm",
    "video/ogg",
    "video/quicktime",
    "audio/mp4",
    "audio/webm",
    "audio/aac",
    "audio/mpeg",
    "audio/ogg",
    "audio/wave",
    "audio/wav",
    "audio/x-wav",
    "audio/x-pn-wav",
    "audio/flac",
    "audio/x-flac",
];

/// Whether content of this type may be shown inline (by its MIME essence).
pub fn is_inline(content_type: &str) -> bool {
    content_type
        .parse::<mime::Mime>()
        .is_ok_and(|m| INLINE_TYPES.contains(&m.essence_str()))
}

/// Even content served inline cannot run scripts or load anything.
const CONTENT_SECURITY_POLICY: &str = "sandbox; default-src 'none'; script-src 'none'; \
     plugin-types application/pdf; style-src 'unsafe-inline'; media-src 'self'; object-src 'self';";

/// Serves a stored file: range requests and conditional requests come from `NamedFile`.
async fn serve(req: &HttpRequest, download: Download, name: Option<&str>) -> Result<HttpResponse> {
    // A file missing on disk (a process of a scale-out not sharing the media directory, a
    // database restored without its media) is not found, not a server failure.
    let file = NamedFile::open_async(&download.path)
        .await
        .map_err(|err| match err.kind() {
            std::io::ErrorKind::NotFound => Error::not_found("Media file not found"),
            _ => Error::internal(err),
        })?;
    let mime: mime::Mime = download
        .content_type
        .parse()
        .unwrap_or(mime::APPLICATION_OCTET_STREAM);
    let inline = INLINE_TYPES.contains(&mime.essence_str());
    let mut parameters = Vec::new();
    if let Some(name) = name.or(download.filename.as_deref()) {
        parameters.push(if name.is_ascii() {
            DispositionParam::Filename(name.to_owned())
        } else {
            DispositionParam::FilenameExt(ExtendedValue {
                charset: Charset::Ext("UTF-8".into()),
                language_tag: None,
                value: name.as_bytes().to_vec(),
            })
        });
    }
    let disposition = ContentDisposition {
        disposition: if inline {
            DispositionType::Inline
        } else {
            DispositionType::Attachment
        },
        parameters,
    };
    let mut response = file
        .set_content_type(mime)
        .set_content_disposition(disposition)
        .into_response(req);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::HeaderName::from_static("cross-origin-resource-policy"),
        HeaderValue::from_static("cross-origin"),
    );
    headers.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=86400, s-maxage=86400"),
    );
    Ok(response)
}

fn method(method: Option<&ruma::media::Method>) -> Method {
    match method {
        Some(ruma::media::Method::Crop) => Method::Crop,
        _ => Method::Scale,
    }
}

fn upload_content_type(req: &HttpRequest) -> Option<String> {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// Refuses a declared body size over the limit before reading any of it.
fn check_declared_size(req: &HttpRequest, services: &Services) -> Result<()> {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let limit = services.media.max_upload_size();
    if declared.is_some_and(|n| n > limit) {
        return Err(Error::too_large(format!(
            "Uploads are limited to {limit} bytes"
        )));
    }
    Ok(())
}

/// The `filename` query parameter of an upload.
#[derive(Deserialize)]
pub struct UploadQuery {
    filename: Option<String>,
}

/// `POST /_matrix/media/v3/upload`
pub async fn upload_route(
    services: Data<Services>,
    caller: Authenticated,
    req: HttpRequest,
    query: Query<UploadQuery>,
    body: Payload,
) -> Result<HttpResponse> {
    check_declared_size(&req, &services)?;
    let uploaded = services
        .media
        .upload(
            caller.0.user_id.as_str(),
            upload_content_type(&req).as_deref(),
            query.filename.as_deref(),
            body,
        )
        .await?;
    let mut answer = json!({ "content_uri": uploaded.content_uri });
    if let Some(hash) = uploaded.blurhash {
        answer["xyz.amorgan.blurhash"] = hash.into();
    }
    Ok(HttpResponse::Ok().json(answer))
}

/// `PUT /_matrix/media/v3/upload/{serverName}/{mediaId}`
pub async fn upload_pending_route(
    services: Data<Services>,
    caller: Authenticated,
    req: HttpRequest,
    path: Path<(String, String)>,
    query: Query<UploadQuery>,
    body: Payload,
) -> Result<HttpResponse> {
    check_declared_size(&req, &services)?;
    let (server_name, media_id) = path.into_inner();
    let blurhash = services
        .media
        .upload_pending(
            caller.0.user_id.as_str(),
            &server_name,
            &media_id,
            upload_content_type(&req).as_deref(),
            query.filename.as_deref(),
            body,
        )
        .await?;
    let mut answer = json!({});
    if let Some(hash) = blurhash {
        answer["xyz.amorgan.blurhash"] = hash.into();
    }
    Ok(HttpResponse::Ok().json(answer))
}

/// `POST /_matrix/media/v1/create`
pub async fn create_route(
    services: Data<Services>,
    body: Ruma<create_mxc::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let (content_uri, expires) = services.media.create(caller.user_id.as_str()).await?;
    Ok(
        HttpResponse::Ok()
            .json(json!({ "content_uri": content_uri, "unused_expires_at": expires })),
    )
}

fn config(services: &Services) -> HttpResponse {
    HttpResponse::Ok().json(json!({ "m.upload.size": services.media.max_upload_size() }))
}

/// `GET /_matrix/client/v1/media/config`
pub async fn config_route(
    services: Data<Services>,
    body: Ruma<media_config::Request>,
) -> Result<HttpResponse> {
    body.caller()?;
    Ok(config(&services))
}

/// `GET /_matrix/client/v1/media/preview_url`
pub async fn preview_route(
    services: Data<Services>,
    body: Ruma<preview::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let preview = services
        .url_previews
        .preview(&body.body.url, &caller.user_id, &services.media)
        .await?;
    Ok(HttpResponse::Ok().json(preview))
}

/// `GET /_matrix/media/v3/preview_url` (legacy)
#[allow(deprecated)]
pub async fn legacy_preview_route(
    services: Data<Services>,
    body: Ruma<legacy_preview::Request>,
) -> Result<HttpResponse> {
    let caller = body.caller()?;
    let preview = services
        .url_previews
        .preview(&body.body.url, &caller.user_id, &services.media)
        .await?;
    Ok(HttpResponse::Ok().json(preview))
}

/// `GET /_matrix/media/v3/config` (legacy)
pub async fn legacy_config_route(
    services: Data<Services>,
    body: Ruma<legacy_config::Request>,
) -> Result<HttpResponse> {
    body.caller()?;
    Ok(config(&services))
}

/// Serves a download (authenticated or `legacy`), under `name` when the path gives one.
async fn download_file(
    services: &Services,
    req: &HttpRequest,
    server_name: &ruma::ServerName,
    media_id: &str,
    name: Option<&str>,
    legacy: bool,
) -> Result<HttpResponse> {
    let file = services
        .media
        .download(server_name.as_str(), media_id, legacy)
        .await?;
    serve(req, file, name).await
}

/// Serves a thumbnail (authenticated or `legacy`).
async fn thumbnail_file(
    services: &Services,
    req: &HttpRequest,
    (server_name, media_id): (&ruma::ServerName, &str),
    (width, height): (ruma::UInt, ruma::UInt),
    requested: Option<&ruma::media::Method>,
    legacy: bool,
) -> Result<HttpResponse> {
    let file = services
        .media
        .thumbnail(
            server_name.as_str(),
            media_id,
            u32::try_from(width).unwrap_or(u32::MAX),
            u32::try_from(height).unwrap_or(u32::MAX),
            method(requested),
            legacy,
        )
        .await?;
    // Thumbnails are images, served inline; the name only gives a saved copy an extension.
    let name = format!(
        "thumbnail.{}",
        file.content_type.strip_prefix("image/").unwrap_or("png")
    );
    serve(req, file, Some(&name)).await
}

/// `GET /_matrix/client/v1/media/download/{serverName}/{mediaId}`
pub async fn download_route(
    services: Data<Services>,
    body: Ruma<download::Request>,
    req: HttpRequest,
) -> Result<HttpResponse> {
    body.caller()?;
    let r = &body.body;
    download_file(&services, &req, &r.server_name, &r.media_id, None, false).await
}

/// `GET /_matrix/client/v1/media/download/{serverName}/{mediaId}/{fileName}`
pub async fn download_named_route(
    services: Data<Services>,
    body: Ruma<download_named::Request>,
    req: HttpRequest,
) -> Result<HttpResponse> {
    body.caller()?;
    let r = &body.body;
    download_file(
        &services,
        &req,
        &r.server_name,
        &r.media_id,
        Some(&r.filename),
        false,
    )
    .await
}

/// `GET /_matrix/client/v1/media/thumbnail/{serverName}/{mediaId}`
pub async fn thumbnail_route(
    services: Data<Services>,
    body: Ruma<thumbnail::Request>,
    req: HttpRequest,
) -> Result<HttpResponse> {
    body.caller()?;
    let r = &body.body;
    let media = (&*r.server_name, r.media_id.as_str());
    thumbnail_file(
        &services,
        &req,
        media,
        (r.width, r.height),
        r.method.as_ref(),
        false,
    )
    .await
}

/// `GET /_matrix/media/v3/download/{serverName}/{mediaId}` (legacy, unauthenticated)
pub async fn legacy_download_route(
    services: Data<Services>,
    body: Ruma<legacy_download::Request>,
    req: HttpRequest,
) -> Result<HttpResponse> {
    let r = &body.body;
    download_file(&services, &req, &r.server_name, &r.media_id, None, true).await
}

/// `GET /_matrix/media/v3/download/{serverName}/{mediaId}/{fileName}` (legacy)
pub async fn legacy_download_named_route(
    services: Data<Services>,
    body: Ruma<legacy_download_named::Request>,
    req: HttpRequest,
) -> Result<HttpResponse> {
    let r = &body.body;
    download_file(
        &services,
        &req,
        &r.server_name,
        &r.media_id,
        Some(&r.filename),
        true,
    )
    .await
}

/// `GET /_matrix/media/v3/thumbnail/{serverName}/{mediaId}` (legacy)
pub async fn legacy_thumbnail_route(
    services: Data<Services>,
    body: Ruma<legacy_thumbnail::Request>,
    req: HttpRequest,
) -> Result<HttpResponse> {
    let r = &body.body;
    let media = (&*r.server_name, r.media_id.as_str());
    thumbnail_file(
        &services,
        &req,
        media,
        (r.width, r.height),
        r.method.as_ref(),
        true,
    )
    .await
}
