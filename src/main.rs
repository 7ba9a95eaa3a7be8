//! The `myelin` command: serve, migrate, and manage users.

use std::{io::BufRead, net::TcpListener, path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use myelin::{
    config::{Config, LogFormat},
    embedded_pg::EmbeddedPostgres,
    server,
    service::Services,
    storage::{self, Db},
};

/// Myelin, a Matrix homeserver.
///
/// Configuration comes from an optional TOML file (--config or MYELIN_CONFIG) and the
/// environment (MYELIN_SERVER_NAME, MYELIN_LISTEN, MYELIN_DATA_DIR, DATABASE_URL,
/// MYELIN_REGISTRATION, MYELIN_RATE_LIMITS, ...; see README.md). Without DATABASE_URL the
/// server runs its own PostgreSQL cluster under the data directory.
#[derive(Parser)]
#[command(name = "myelin", version)]
struct Cli {
    /// Path of the TOML configuration file (overrides MYELIN_CONFIG).
    #[arg(long, global = true)]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the homeserver (the default): migrate the database, then serve HTTP.
    Serve,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Ask the running server's `/health` whether it is alive (exit status 0 when it answers
    /// `OK`, 1 otherwise): Docker's `HEALTHCHECK`.
    Healthcheck {
        /// The URL to ask (default `http://<MYELIN_LISTEN>/health`, loopback when MYELIN_LISTEN
        /// is `0.0.0.0` or `[::]`).
        #[arg(long)]
        url: Option<String>,
    },
    /// Manage user accounts.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Recompute a user's unread counts from events, receipts and push rules and report any
    /// difference from what the server maintains (exit status 1 when there is one).
    CheckUnread {
        /// The user (`@alice:example.org`).
        user: String,
        /// Only this room (default: every room the user is joined to).
        #[arg(long)]
        room: Option<String>,
        /// Replace what differs with the recomputed values.
        #[arg(long)]
        fix: bool,
    },
}

#[derive(Subcommand)]
enum UserCommand {
    /// Create an account (the way in when registration is closed).
    Create {
        /// Localpart of the new user (the `alice` in `@alice:example.org`).
        localpart: String,
        /// Password; read from the first line of standard input when omitted.
        #[arg(long)]
        password: Option<String>,
        /// Make the user a server administrator.
        #[arg(long)]
        admin: bool,
    },
}

/// The database the server uses, and the embedded cluster if it started one.
struct Database {
    url: String,
    embedded: Option<EmbeddedPostgres>,
}

impl Database {
    async fn open(config: &Config) -> Result<Self, String> {
        if let Some(url) = &config.database_url {
            return Ok(Database {
                url: url.clone(),
                embedded: None,
            });
        }
        let pg = EmbeddedPostgres::new(&config.data_dir)?;
        let started_here = pg.start()?;
        pg.ensure_database("myelin").await?;
        let url = pg.url("myelin");
        Ok(Database {
            url,
            embedded: started_here.then_some(pg),
        })
    }

    fn close(self) {
        if let Some(pg) = self.embedded {
            if let Err(err) = pg.stop() {
                eprintln!("myelin: could not stop the embedded PostgreSQL: {err}");
            }
        }
    }
}

fn main() -> ExitCode {
    // Before any thread exists: glibc fixes its arena limit when a thread first needs one.
    myelin::allocator::return_freed_memory();
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => {
            let (code, database) = runtime.block_on(serve_or_run());
            // Background tasks (senders, the notification listener) end with the runtime,
            // before the embedded PostgreSQL stops under them.
            runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            if let Some(database) = database {
                database.close();
            }
            code
        }
        Err(err) => {
            eprintln!("myelin: cannot start the async runtime: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command; hands back the database so the embedded cluster is stopped after the
/// runtime.
async fn serve_or_run() -> (ExitCode, Option<Database>) {
    let cli = Cli::parse();
    if let Some(Command::Healthcheck { url: Some(url) }) = &cli.command {
        return (healthcheck(url).await, None);
    }
    let config = match Config::load(cli.config) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("myelin: {err}");
            return (ExitCode::from(2), None);
        }
    };
    let command = cli.command.unwrap_or(Command::Serve);
    if let Command::Healthcheck { .. } = command {
        return (
            healthcheck(&myelin::healthcheck::local_health_url(config.listen)).await,
            None,
        );
    }
    init_logging(config.ops.log_format);
    myelin::api::ruma::install_panic_hook();
    if let Some((from, to)) = myelin::limits::raise_open_files_limit() {
        tracing::debug!(from, to, "raised the open files limit");
    }
    for warning in config.warnings() {
        tracing::warn!("{warning}");
    }
    // A server listens first: its probes answer while the database starts and migrates.
    let starting = match command {
        Command::Serve => match server::Starting::listen(config.listen) {
            Ok(starting) => Some(starting),
            Err(err) => {
                eprintln!("myelin: {err}");
                return (ExitCode::FAILURE, None);
            }
        },
        _ => None,
    };
    let database = match Database::open(&config).await {
        Ok(database) => database,
        Err(err) => {
            eprintln!("myelin: database: {err}");
            return (ExitCode::FAILURE, None);
        }
    };
    let result = run(command, config, &database.url, starting).await;
    let code = match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("myelin: {err}");
            ExitCode::FAILURE
        }
    };
    (code, Some(database))
}

/// Logs go to stderr: text (coloured only on a terminal) or JSON lines.
fn init_logging(format: LogFormat) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| "info,actix_server=warn".into());
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => logs.with_ansi(std::io::stderr().is_terminal()).init(),
        // One object per line: the event's fields at the top level, the request span's
        // (method, route, user) under "span".
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
    }
}

/// `myelin healthcheck`: exit status 0 when `url` answers `OK`.
async fn healthcheck(url: &str) -> ExitCode {
    match myelin::healthcheck::probe(url).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("myelin: unhealthy: {err}");
            ExitCode::FAILURE
        }
    }
}

/// Tells the admin when PostgreSQL will never refresh its statistics by itself.
async fn warn_without_autovacuum(db: &Db) {
    let Ok(conn) = db.conn().await else {
        return;
    };
    if let Ok(false) = storage::autovacuum_is_on(&conn).await {
        tracing::warn!(
            "PostgreSQL's autovacuum is off: Myelin refreshes the planner statistics of its \
             tables itself, but nothing reclaims the space of deleted rows; run VACUUM on the \
             database regularly (for example daily)"
        );
    }
}

/// Binds the federation listener when one is configured and federation is on.
fn federation_listener(config: &Config) -> Result<Option<server::FederationListener>, String> {
    let federation = &config.federation;
    let (Some(address), Some(tls), true) = (federation.listen, &federation.tls, federation.enabled)
    else {
        return Ok(None);
    };
    let tls = server::tls_config(&tls.cert, &tls.key)?;
    let listener = TcpListener::bind(address)
        .map_err(|e| format!("cannot listen on {address} (MYELIN_FEDERATION_LISTEN): {e}"))?;
    Ok(Some(server::FederationListener { listener, tls }))
}

async fn run(
    command: Command,
    config: Config,
    database_url: &str,
    starting: Option<server::Starting>,
) -> Result<(), String> {
    let applied = storage::run_migrations(database_url).await?;
    if applied > 0 {
        tracing::info!(applied, "database migrated");
    }
    let http_workers = match command {
        Command::Serve => server::http_workers(),
        _ => 0,
    };
    let db = Db::connect(database_url, config.database_pool_size, http_workers)
        .map_err(|e| e.to_string())?;
    match command {
        Command::Migrate => {
            println!("myelin: {applied} migration(s) applied; the database is up to date");
            Ok(())
        }
        // Answered before the database is opened.
        Command::Healthcheck { .. } => Ok(()),
        Command::Serve => {
            let starting = starting.ok_or("the listener was not bound before start")?;
            let federation = federation_listener(&config)?;
            let metrics = config
                .ops
                .metrics_listen
                .map(|address| {
                    TcpListener::bind(address).map_err(|e| {
                        format!("cannot listen on {address} (MYELIN_METRICS_LISTEN): {e}")
                    })
                })
                .transpose()?;
            warn_without_autovacuum(&db).await;
            let services = Services::new(config, db).await.map_err(|e| e.to_string())?;
            services.notifier.listen(database_url.to_owned());
            services.push_sender.start();
            services.federation.sender.start();
            services
                .register_appservice_senders()
                .await
                .map_err(|e| e.to_string())?;
            services.appservice_sender.start();
            myelin::service::delayed_events::DelayedEvents::start(services.clone());
            if services.config.ops.statistics_refresh {
                myelin::service::statistics::start(services.db.clone());
            }
            services.presence.start_sweeper();
            if let Some(every) = services.config.ops.consistency_sample_every {
                myelin::service::consistency::start(services.clone(), every);
            }
            let listener = starting.finish().await;
            server::serve(services, listener, federation, metrics)
                .await
                .map_err(|e| e.to_string())
        }
        Command::CheckUnread { user, room, fix } => {
            let user_id = ruma::UserId::parse(user.as_str()).map_err(|e| format!("{user}: {e}"))?;
            let room_id = room
                .as_deref()
                .map(ruma::RoomId::parse)
                .transpose()
                .map_err(|e| format!("room: {e}"))?;
            warn_without_autovacuum(&db).await;
            let services = Services::new(config, db).await.map_err(|e| e.to_string())?;
            let reports = services
                .rooms
                .check_unread(&user_id, room_id.as_deref(), fix)
                .await
                .map_err(|e| e.to_string())?;
            let mut differences = 0;
            for (room_id, report) in &reports {
                println!(
                    "{room_id}: {} push action(s) expected, {} missing, {} unexpected{}",
                    report.expected,
                    report.missing.len(),
                    report.unexpected.len(),
                    if fix && !report.is_consistent() {
                        " (fixed)"
                    } else {
                        ""
                    }
                );
                differences += usize::from(!report.is_consistent());
            }
            if differences > 0 && !fix {
                return Err(format!(
                    "{differences} room(s) differ; run again with --fix to repair"
                ));
            }
            Ok(())
        }
        Command::User {
            command:
                UserCommand::Create {
                    localpart,
                    password,
                    admin,
                },
        } => {
            let password = match password {
                Some(p) => p,
                None => {
                    let mut line = String::new();
                    std::io::stdin()
                        .lock()
                        .read_line(&mut line)
                        .map_err(|e| e.to_string())?;
                    line.trim_end_matches(['\r', '\n']).to_owned()
                }
            };
            if password.is_empty() {
                return Err("a password is required (--password or standard input)".into());
            }
            warn_without_autovacuum(&db).await;
            let services = Services::new(config, db).await.map_err(|e| e.to_string())?;
            let user_id = services
                .users
                .check_available(&localpart)
                .await
                .map_err(|e| e.to_string())?;
            services
                .users
                .register(&user_id, Some(password), admin, None, None)
                .await
                .map_err(|e| e.to_string())?;
            println!(
                "myelin: created {user_id}{}",
                if admin { " (admin)" } else { "" }
            );
            Ok(())
        }
    }
}
