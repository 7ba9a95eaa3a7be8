//! A private PostgreSQL cluster under the data directory, for running without `DATABASE_URL`.
//!
//! `initdb` on first start, `pg_ctl start` on a Unix socket in the data directory (no TCP),
//! `pg_ctl stop` when the server stops. Run as root, the cluster is owned by and run as the
//! `postgres` system user, because PostgreSQL refuses to run as root.
//!
//! Only the OS user running myelin may connect: `postgres/` and the socket directory are 0700,
//! the socket itself 0700, and `pg_hba.conf` (rewritten at every start, so older clusters made
//! with `--auth=trust` are fixed too) allows peer authentication only, mapping this OS user
//! (and the cluster's owner) to the `postgres` role. Where the OS user has no name to map
//! (a uid without a passwd entry, as in some containers), it falls back to trust on the
//! socket, which the 0700 directory still keeps to this user.

use std::{
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
};

use diesel::{sql_types::Bool, QueryableByName};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};

/// Port number used only to name the Unix socket (`.s.PGSQL.<port>`).
const SOCKET_PORT: u16 = 5432;

/// A running (or startable) private cluster.
pub struct EmbeddedPostgres {
    bin_dir: PathBuf,
    data_dir: PathBuf,
    socket_dir: PathBuf,
    log_file: PathBuf,
    run_as: Option<(u32, u32)>,
    extra_options: String,
}

/// Finds `initdb` and `pg_ctl`: on `PATH`, else the newest `/usr/lib/postgresql/*/bin`.
pub fn find_binaries() -> Result<PathBuf, String> {
    let on_path = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .unwrap_or_default();
    if let Some(dir) = on_path
        .into_iter()
        .find(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
    {
        return Ok(dir);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin).ok_or_else(|| {
        "no PostgreSQL server binaries (initdb, pg_ctl) found on PATH or in /usr/lib/postgresql/*/bin; \
         install them (Debian/Ubuntu: apt-get install postgresql) or set DATABASE_URL"
            .to_owned()
    })
}

/// One `/etc/passwd` entry: name, uid, gid.
fn passwd_entries() -> Vec<(String, u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let name = fields.next()?.to_owned();
            let uid = fields.nth(1)?.parse().ok()?;
            let gid = fields.next()?.parse().ok()?;
            Some((name, uid, gid))
        })
        .collect()
}

/// uid and gid of a system user, from `/etc/passwd`.
fn lookup_user(name: &str) -> Option<(u32, u32)> {
    passwd_entries()
        .into_iter()
        .find(|(n, _, _)| n == name)
        .map(|(_, uid, gid)| (uid, gid))
}

/// The name of the user with this uid, from `/etc/passwd`.
fn user_name(uid: u32) -> Option<String> {
    passwd_entries()
        .into_iter()
        .find(|(_, u, _)| *u == uid)
        .map(|(name, _, _)| name)
}

/// The uid this process runs as.
fn own_uid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(u32::MAX)
}

fn is_root() -> bool {
    own_uid() == 0
}

/// Makes a directory private to its owner (0700).
fn make_private(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("cannot make {} private: {e}", dir.display()))
}

impl EmbeddedPostgres {
    /// Describes a cluster under `base_dir/postgres`; nothing runs until [`start`](Self::start).
    pub fn new(base_dir: &Path) -> Result<Self, String> {
        let bin_dir = find_binaries()?;
        let base = std::path::absolute(base_dir.join("postgres")).map_err(|e| e.to_string())?;
        let run_as = if is_root() {
            Some(lookup_user("postgres").ok_or_else(|| {
                "running as root, but there is no 'postgres' system user to run the embedded \
                 PostgreSQL as; create one or set DATABASE_URL"
                    .to_owned()
            })?)
        } else {
            None
        };
        Ok(EmbeddedPostgres {
            bin_dir,
            data_dir: base.join("data"),
            socket_dir: base.join("run"),
            log_file: base.join("postgres.log"),
            run_as,
            extra_options: String::new(),
        })
    }

    /// Trades durability for speed (tests only): no fsync, no synchronous commit.
    pub fn for_tests(mut self) -> Self {
        self.extra_options =
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off".to_owned();
        self
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(self.bin_dir.join(program));
        if let Some((uid, gid)) = self.run_as {
            command.uid(uid).gid(gid);
        }
        command.stdin(Stdio::null());
        command
    }

    fn base_dir(&self) -> &Path {
        self.data_dir.parent().expect("data dir has a parent")
    }

    fn prepare_dirs(&self) -> Result<(), String> {
        for dir in [&self.data_dir, &self.socket_dir] {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let base = self.base_dir();
        if let Some((uid, gid)) = self.run_as {
            for path in [base, &self.data_dir, &self.socket_dir] {
                std::os::unix::fs::chown(path, Some(uid), Some(gid)).map_err(|e| {
                    format!("cannot hand {} to the postgres user: {e}", path.display())
                })?;
            }
        }
        // Nobody else may reach the socket, the data or the log.
        for dir in [base, &self.data_dir, &self.socket_dir] {
            make_private(dir)?;
        }
        Ok(())
    }

    /// Writes `pg_hba.conf` and `pg_ident.conf`: peer authentication over the socket for
    /// this OS user and the cluster's owner, as the `postgres` role; no TCP.
    fn write_auth_config(&self) -> Result<(), String> {
        let own = user_name(own_uid());
        let owner = match self.run_as {
            Some((uid, _)) => user_name(uid),
            None => own.clone(),
        };
        let (hba, ident) = match (own, owner) {
            (Some(own), Some(owner)) => {
                let mut ident = format!("myelin {own} postgres\n");
                if owner != own {
                    ident.push_str(&format!("myelin {owner} postgres\n"));
                }
                ("local all all peer map=myelin\n".to_owned(), ident)
            }
            // No user name to map: the 0700 socket directory is the only gate left.
            _ => ("local all all trust\n".to_owned(), String::new()),
        };
        let header = "# Written by myelin at every start; changes here are overwritten.\n";
        for (file, text) in [("pg_hba.conf", hba), ("pg_ident.conf", ident)] {
            let path = self.data_dir.join(file);
            std::fs::write(&path, format!("{header}{text}"))
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            if let Some((uid, gid)) = self.run_as {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                    .map_err(|e| format!("cannot hand {} to postgres: {e}", path.display()))?;
            }
        }
        Ok(())
    }

    fn run(&self, mut command: Command, what: &str) -> Result<(), String> {
        let output = command
            .output()
            .map_err(|e| format!("cannot run {what}: {e}"))?;
        if output.status.success() {
            Ok(())
        } else {
            let stderr = String::from_utf8_lossy(&output.stderr);
            Err(format!("{what} failed: {}", stderr.trim()))
        }
    }

    /// Initialises the cluster on first use and starts it. Returns false when it was already
    /// running (another `myelin` process started it), in which case the caller must not stop it.
    pub fn start(&self) -> Result<bool, String> {
        self.prepare_dirs()?;
        if !self.data_dir.join("PG_VERSION").exists() {
            let mut initdb = self.command("initdb");
            initdb.args([
                "--no-sync",
                "-U",
                "postgres",
                // Replaced by write_auth_config before the first start.
                "--auth-local=peer",
                "--auth-host=reject",
                "--encoding=UTF8",
                "--locale=C",
                "-D",
            ]);
            initdb.arg(&self.data_dir);
            self.run(initdb, "initdb")?;
        }
        self.write_auth_config()?;
        let mut status = self.command("pg_ctl");
        status
            .arg("status")
            .arg("-D")
            .arg(&self.data_dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if status.status().is_ok_and(|s| s.success()) {
            return Ok(false);
        }
        let options = format!(
            "-k {} -p {SOCKET_PORT} -c listen_addresses='' -c unix_socket_permissions=0700 {}",
            self.socket_dir.display(),
            self.extra_options
        );
        let mut start = self.command("pg_ctl");
        start
            .args(["start", "-w", "-t", "60", "-D"])
            .arg(&self.data_dir)
            .arg("-l")
            .arg(&self.log_file);
        start.args(["-o", &options]).stdout(Stdio::null());
        self.run(start, "pg_ctl start")
            .map_err(|e| format!("{e} (see {})", self.log_file.display()))?;
        Ok(true)
    }

    /// Stops the cluster (fast shutdown: open sessions are ended, data is safe).
    pub fn stop(&self) -> Result<(), String> {
        let mut stop = self.command("pg_ctl");
        stop.args(["stop", "-w", "-m", "fast", "-D"])
            .arg(&self.data_dir)
            .stdout(Stdio::null());
        self.run(stop, "pg_ctl stop")
    }

    /// Connection string for a database in this cluster.
    pub fn url(&self, database: &str) -> String {
        format!(
            "host={} port={SOCKET_PORT} user=postgres dbname={database}",
            self.socket_dir.display()
        )
    }

    /// Creates a database if it does not exist yet.
    pub async fn ensure_database(&self, database: &str) -> Result<(), String> {
        create_database_if_missing(&self.url("postgres"), database).await
    }
}

#[derive(QueryableByName)]
struct Exists {
    #[diesel(sql_type = Bool)]
    exists: bool,
}

/// Creates `database` through the maintenance connection `admin_url` unless it exists.
pub async fn create_database_if_missing(admin_url: &str, database: &str) -> Result<(), String> {
    let mut conn = AsyncPgConnection::establish(admin_url)
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let found: Exists =
        diesel::sql_query("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) AS exists")
            .bind::<diesel::sql_types::Text, _>(database)
            .get_result(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
    if !found.exists {
        let name = database.replace('"', "\"\"");
        diesel::sql_query(format!("CREATE DATABASE \"{name}\""))
            .execute(&mut conn)
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
