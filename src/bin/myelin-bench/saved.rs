//! A scenario's set-up saved to a file, for a server whose own API would take hours to set it
//! up: one server is set up through its API and writes what it made (`--set-up-save`), its
//! data is loaded into the other server's database (`tests/bench/loaded.sh`), and the other
//! server is measured against the saved set-up (`--set-up-from`) with the same checks.
//! Scenarios 11 (long history), 12 (big room), 13 (big account) and 14 (start-up) take these
//! files.

use std::path::Path;

use serde::{de::DeserializeOwned, Serialize};

use crate::client::Failure;

/// Where a scenario's set-up comes from and goes.
#[derive(Clone, Copy)]
pub struct SetUpFiles<'a> {
    /// Measure a server that already holds the set-up written here, instead of making one.
    pub from: Option<&'a Path>,
    /// Write the set-up made here, for another server loaded with the same data.
    pub save: Option<&'a Path>,
}

impl SetUpFiles<'_> {
    /// The saved set-up to measure against, if one was given.
    pub fn load<T: DeserializeOwned>(&self) -> Result<Option<T>, Failure> {
        let Some(path) = self.from else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_str(&text).map(Some).map_err(|e| {
            format!(
                "{} is not this scenario's saved set-up: {e}",
                path.display()
            )
        })
    }

    /// Writes the set-up, if a file to save it in was given.
    pub fn store<T: Serialize>(&self, set_up: &T) -> Result<(), Failure> {
        let Some(path) = self.save else {
            return Ok(());
        };
        let text = serde_json::to_string(set_up).expect("JSON");
        std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}

/// What a report says of a set-up loaded from another server's.
pub const LOADED: &str = "loaded into the server's database from another server's set-up";
