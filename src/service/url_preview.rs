//! URL previews (`preview_url`): the page is fetched through the outbound client (its address
//! policy, timeouts, and redirects checked hop by hop), its Open Graph `<meta>` tags and
//! `<title>` read with an HTML tokenizer, its `og:image` (or the URL itself, when it is an
//! image) fetched the same way and stored as media of the requester (thumbnailed on request
//! like any upload), and the result cached for an hour. Off by default, like Synapse's
//! `url_preview_enabled`: then every preview is the empty object.

use std::{
    num::NonZeroUsize,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use html5gum::{emitters::default::DefaultEmitter, Token, Tokenizer};
use lru::LruCache;
use reqwest::Url;
use ruma::UserId;
use serde_json::{Map, Value};

use crate::{
    error::{Error, Result},
    service::{
        media::Media,
        outbound::{FetchedPage, Outbound, OutboundError},
    },
};

/// Most of a page that is read (Open Graph tags sit in `<head>`).
const MAX_PAGE: usize = 1024 * 1024;
/// Largest image stored for a preview (and never more than `MYELIN_MAX_UPLOAD_SIZE`).
const MAX_IMAGE: usize = 10 * 1024 * 1024;
/// Redirects followed.
const MAX_REDIRECTS: usize = 5;
/// How long a preview is served from the cache.
const CACHE_FOR: Duration = Duration::from_secs(3600);
/// Previews kept in the cache.
const CACHE_SIZE: usize = 1000;
/// Open Graph properties kept per page.
const MAX_PROPERTIES: usize = 50;
/// Longest property value kept, in characters.
const MAX_VALUE: usize = 1000;

/// Fetches and caches previews.
pub struct UrlPreviews {
    enabled: bool,
    outbound: Arc<Outbound>,
    cache: Mutex<LruCache<String, (Instant, Value)>>,
}

impl UrlPreviews {
    /// Creates the service; `enabled` is `MYELIN_URL_PREVIEWS`.
    pub fn new(enabled: bool, outbound: Arc<Outbound>) -> Self {
        UrlPreviews {
            enabled,
            outbound,
            cache: Mutex::new(LruCache::new(
                NonZeroUsize::new(CACHE_SIZE).expect("not zero"),
            )),
        }
    }

    /// The Open Graph data of `url` (`{}` when previews are off or the page has none); an
    /// image is stored as media uploaded by `requester`.
    pub async fn preview(&self, url: &str, requester: &UserId, media: &Media) -> Result<Value> {
        let parsed = self.outbound.check_url(url).map_err(|err| match err {
            OutboundError::BadUrl(_) => Error::invalid_param("url must be an http or https URL"),
            other => unreachable_error(&other),
        });
        if !self.enabled {
            // The URL is still checked for shape, as before previews could be fetched.
            return match parsed {
                Err(err) if err.errcode() == "M_INVALID_PARAM" => Err(err),
                _ => Ok(Value::Object(Map::new())),
            };
        }
        let parsed = parsed?;
        let key = parsed.to_string();
        if let Some((at, preview)) = self.lock().get(&key) {
            if at.elapsed() < CACHE_FOR {
                return Ok(preview.clone());
            }
        }
        // Enough of a page for its head; all of an image (one byte more tells it is too big).
        let image_limit = media.max_upload_size().min(MAX_IMAGE as u64) as usize;
        let read = |content_type: Option<&str>| {
            let is_image =
                content_type.is_some_and(|t| t.to_ascii_lowercase().starts_with("image/"));
            if is_image {
                image_limit + 1
            } else {
                MAX_PAGE
            }
        };
        let page = self
            .outbound
            .get_page(parsed.as_str(), read, MAX_REDIRECTS)
            .await
            .map_err(|err| unreachable_error(&err))?;
        if !page.status.is_success() {
            return Err(Error::matrix(
                actix_web::http::StatusCode::BAD_GATEWAY,
                "M_UNKNOWN",
                format!("The page answered {}", page.status),
            ));
        }
        let content_type = page
            .content_type
            .as_deref()
            .unwrap_or("")
            .to_ascii_lowercase();
        let mut preview = Map::new();
        if content_type.starts_with("text/html") || content_type.starts_with("application/xhtml") {
            preview = open_graph(&page.body);
            let image = preview
                .remove("og:image")
                .and_then(|v| v.as_str().and_then(|i| page.url.join(i).ok()));
            if let Some(image_url) = image {
                match self
                    .outbound
                    .get_page(image_url.as_str(), &read, MAX_REDIRECTS)
                    .await
                {
                    Ok(image) => {
                        preview.extend(store_image(media, requester, image, image_limit).await);
                    }
                    Err(err) => tracing::info!("url preview image {image_url}: {err}"),
                }
            }
        } else if content_type.starts_with("image/") {
            preview.extend(store_image(media, requester, page, image_limit).await);
        }
        let preview = Value::Object(preview);
        self.lock().put(key, (Instant::now(), preview.clone()));
        Ok(preview)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LruCache<String, (Instant, Value)>> {
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Stores a fetched image as media; its `og:image` fields, or none when it is no image or
/// larger than `limit` (a cut-off body would be a broken image).
async fn store_image(
    media: &Media,
    requester: &UserId,
    image: FetchedPage,
    limit: usize,
) -> Map<String, Value> {
    let mut fields = Map::new();
    let content_type = image.content_type.unwrap_or_default();
    if !image.status.is_success()
        || !content_type.to_ascii_lowercase().starts_with("image/")
        || image.body.len() > limit
    {
        return fields;
    }
    let size = image.body.len();
    let dimensions = image::ImageReader::new(std::io::Cursor::new(&image.body))
        .with_guessed_format()
        .ok()
        .and_then(|reader| reader.into_dimensions().ok());
    let body = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(
        actix_web::web::Bytes::from(image.body),
    )]);
    let filename = file_name(&image.url);
    match media
        .upload(
            requester.as_str(),
            Some(&content_type),
            filename.as_deref(),
            body,
        )
        .await
    {
        Ok(uploaded) => {
            fields.insert("og:image".into(), uploaded.content_uri.into());
            fields.insert("og:image:type".into(), content_type.into());
            fields.insert("matrix:image:size".into(), size.into());
            if let Some((width, height)) = dimensions {
                fields.insert("og:image:width".into(), width.into());
                fields.insert("og:image:height".into(), height.into());
            }
        }
        Err(err) => tracing::info!("url preview image not stored: {err}"),
    }
    fields
}

/// The last path segment of a URL, as the stored image's name.
fn file_name(url: &Url) -> Option<String> {
    url.path_segments()?
        .next_back()
        .filter(|name| !name.is_empty())
        .map(str::to_owned)
}

/// 502 for a page that cannot be fetched (as Synapse answers a failed lookup); a refused
/// address is reported the same way, so the answer does not map the server's network.
fn unreachable_error(err: &OutboundError) -> Error {
    tracing::info!("url preview: {err}");
    Error::matrix(
        actix_web::http::StatusCode::BAD_GATEWAY,
        "M_UNKNOWN",
        "The page could not be fetched",
    )
}

/// The `og:*` properties of a page's `<meta>` tags, with `<title>` and the `description` meta
/// tag standing in for a missing `og:title` and `og:description` (`og:image` as the page
/// gives it: the caller fetches it and replaces it with an `mxc://` URI, or drops it).
pub fn open_graph(html: &[u8]) -> Map<String, Value> {
    let mut emitter = DefaultEmitter::default();
    // Switch into RCDATA/RAWTEXT after <title>, <script>, <style> as a tree builder would.
    emitter.naively_switch_states(true);
    let mut properties = Map::new();
    let mut title: Option<String> = None;
    let mut in_title = false;
    let mut description: Option<String> = None;
    for token in Tokenizer::new_with_emitter(html, emitter).flatten() {
        match token {
            Token::StartTag(tag) => {
                let name = tag.name.as_slice();
                if name == b"title" && title.is_none() {
                    in_title = true;
                    title = Some(String::new());
                } else if name == b"meta" {
                    let attr = |key: &str| {
                        tag.attributes
                            .get(key.as_bytes())
                            .map(|v| String::from_utf8_lossy(v).trim().to_owned())
                    };
                    let Some(content) = attr("content") else {
                        continue;
                    };
                    let property = attr("property").or_else(|| attr("name"));
                    match property.as_deref() {
                        // The first of each property counts, up to the cap.
                        Some(p)
                            if p.starts_with("og:")
                                && properties.len() < MAX_PROPERTIES
                                && !properties.contains_key(p) =>
                        {
                            properties.insert(p.to_owned(), clip(&content).into());
                        }
                        Some(p) if p.eq_ignore_ascii_case("description") => {
                            description.get_or_insert(content);
                        }
                        _ => {}
                    }
                }
            }
            Token::String(text) if in_title => {
                if let Some(title) = &mut title {
                    title.push_str(&String::from_utf8_lossy(&text));
                }
            }
            Token::EndTag(tag) if tag.name.as_slice() == b"title" => in_title = false,
            _ => {}
        }
    }
    let collapse = |text: &str| clip(&text.split_whitespace().collect::<Vec<_>>().join(" "));
    if let Some(title) = title.map(|t| collapse(&t)).filter(|t| !t.is_empty()) {
        properties.entry("og:title").or_insert(title.into());
    }
    if let Some(description) = description.map(|d| collapse(&d)).filter(|d| !d.is_empty()) {
        properties
            .entry("og:description")
            .or_insert(description.into());
    }
    properties
}

fn clip(text: &str) -> String {
    text.chars().take(MAX_VALUE).collect()
}

#[cfg(test)]
mod tests {
    use super::open_graph;

    #[test]
    fn open_graph_tags_win_over_title_and_description() {
        let page = br#"<!doctype html><html><head>
            <title>Fallback &amp; <b>title</b></title>
            <meta property="og:title" content="The title">
            <meta name="description" content="From description">
            <meta property="og:site_name" content='Site'>
            <meta property="og:image" content="https://example.org/i.png">
            <script>var x = "<meta property='og:url' content='bad'>";</script>
            </head><body><meta property="og:type" content="article"></body></html>"#;
        let og = open_graph(page);
        assert_eq!(og["og:title"], "The title");
        assert_eq!(og["og:description"], "From description");
        assert_eq!(og["og:site_name"], "Site");
        assert_eq!(og["og:type"], "article");
        assert!(og.get("og:url").is_none(), "script contents are not markup");
        assert_eq!(og["og:image"], "https://example.org/i.png");
    }

    #[test]
    fn title_is_the_fallback_and_entities_are_decoded() {
        let og = open_graph(b"<title>\n  Caf&eacute; &lt;menu&gt;\n</title><p>hi");
        assert_eq!(og["og:title"], "Caf\u{e9} <menu>");
        assert!(open_graph(b"not html at all").is_empty());
    }
}
