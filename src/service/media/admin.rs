//! What the admin API does to media: list a user's uploads, quarantine, delete.

use ruma::UserId;

use super::{not_found, Media};
use crate::{
    error::{Error, Result},
    storage::media::{self as store, MediaOrder, MediaRow},
};

/// One page of a user's media.
pub struct MediaPage {
    /// The items.
    pub media: Vec<MediaRow>,
    /// How many items the user has.
    pub total: i64,
}

impl Media {
    /// The media `user_id` uploaded, a page at a time.
    pub async fn list_user_media(
        &self,
        user_id: &UserId,
        order: (MediaOrder, bool),
        from: i64,
        limit: i64,
    ) -> Result<MediaPage> {
        let conn = self.db.conn().await?;
        let (media, total) =
            store::list_user_media(&conn, user_id.as_str(), order, from, limit).await?;
        Ok(MediaPage { media, total })
    }

    /// Quarantines a local media item (`Some(admin)`) or lifts the quarantine (`None`).
    /// Media of other servers is not cached in a way that could be quarantined yet.
    pub async fn set_quarantined(
        &self,
        server_name: &str,
        media_id: &str,
        quarantined_by: Option<&UserId>,
    ) -> Result<()> {
        self.ensure_local(server_name)?;
        let conn = self.db.conn().await?;
        if store::set_quarantined(&conn, media_id, quarantined_by.map(UserId::as_str)).await? {
            Ok(())
        } else {
            Err(not_found())
        }
    }

    /// Deletes a local media item, its thumbnails and any file nothing else uses.
    pub async fn delete_local(&self, server_name: &str, media_id: &str) -> Result<()> {
        self.ensure_local(server_name)?;
        let conn = self.db.conn().await?;
        let hashes = store::delete_media(&conn, media_id)
            .await?
            .ok_or_else(not_found)?;
        for sha256 in hashes {
            if !store::is_content_used(&conn, &sha256).await? {
                if let Err(err) = tokio::fs::remove_file(self.path_of(&sha256)).await {
                    tracing::warn!(%sha256, "could not delete a media file: {err}");
                }
            }
        }
        Ok(())
    }

    fn ensure_local(&self, server_name: &str) -> Result<()> {
        if server_name == self.config.server_name.as_str() {
            Ok(())
        } else {
            Err(Error::invalid_param("Can only act on local media"))
        }
    }
}
