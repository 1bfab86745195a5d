//! A PostgreSQL server started for a test: `initdb` into a temp dir and `postgres` on a free
//! loopback port, stopped (immediate shutdown) on drop. PostgreSQL refuses to run as root, so
//! when the test runs as root the server runs as the `postgres` user, in a temp dir that user
//! owns. It never uses or touches a PostgreSQL the machine already runs.
//!
//! Binaries: `$CHRONOSHARD_PG_BIN` (a directory), else the directory of `initdb` on PATH, else
//! the newest `/usr/lib/postgresql/<version>/bin` (Debian's `postgresql` package).

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::atomic::{AtomicU32, Ordering},
    time::Duration,
};

use anyhow::{bail, Context};
use sqlx::{Connection, Executor};

/// A running PostgreSQL server with trust authentication for the user `chronoshard`.
#[derive(Debug)]
pub struct Postgres {
    port: u16,
    child: tokio::process::Child,
    dir: tempfile::TempDir,
}

impl Postgres {
    pub async fn start() -> anyhow::Result<Postgres> {
        let bin = find_bin()?;
        let dir = tempfile::tempdir()?;
        let user = if nix::unistd::geteuid().is_root() {
            let (uid, gid) = postgres_user()?;
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))?;
            Some((uid, gid))
        } else {
            None
        };
        let data = dir.path().join("data");
        let mut initdb = tokio::process::Command::new(bin.join("initdb"));
        initdb
            .args([
                "-U",
                "chronoshard",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ])
            .arg("-D")
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        as_user(&mut initdb, user);
        let out = initdb.output().await.context("running initdb")?;
        if !out.status.success() {
            bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let mut server = tokio::process::Command::new(bin.join("postgres"));
        server
            .arg("-D")
            .arg(&data)
            .args(["-p", &port.to_string(), "-k"])
            .arg(dir.path())
            // A test server: durability is not what is tested here.
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .args(["-c", "synchronous_commit=off", "-c", "full_page_writes=off"])
            .args(["-c", "max_connections=300"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true);
        as_user(&mut server, user);
        let child = server.spawn().context("starting postgres")?;
        let pg = Postgres { port, child, dir };
        let url = pg.url("postgres");
        crate::wait_for(
            "postgres to accept connections",
            Duration::from_secs(30),
            || {
                let url = url.clone();
                async move { sqlx::PgConnection::connect(&url).await.ok().map(|_| ()) }
            },
        )
        .await?;
        Ok(pg)
    }

    /// The URL of database `db` on this server.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://chronoshard@127.0.0.1:{}/{db}", self.port)
    }

    /// Creates an empty database of its own for one test and returns its URL.
    pub async fn create_database(&self) -> anyhow::Result<String> {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "t{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut conn = sqlx::PgConnection::connect(&self.url("postgres")).await?;
        conn.execute(format!("CREATE DATABASE {name}").as_str())
            .await?;
        conn.close().await?;
        Ok(self.url(&name))
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGQUIT is PostgreSQL's immediate shutdown: it stops its backends and removes its
        // shared memory, which a SIGKILL would leave behind.
        if let Some(pid) = self.child.id() {
            let pid = nix::unistd::Pid::from_raw(pid as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGQUIT);
            for _ in 0..100 {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

fn as_user(cmd: &mut tokio::process::Command, user: Option<(u32, u32)>) {
    if let Some((uid, gid)) = user {
        cmd.uid(uid).gid(gid);
    }
}

/// The uid and gid of the `postgres` user (created by Debian's `postgresql` package).
fn postgres_user() -> anyhow::Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.first() == Some(&"postgres") && f.len() > 3 {
            return Ok((f[2].parse()?, f[3].parse()?));
        }
    }
    bail!("tests run as root and there is no `postgres` user to run PostgreSQL as: install Debian's `postgresql` package (scripts/test.sh does)")
}

fn find_bin() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("CHRONOSHARD_PG_BIN") {
        return Ok(PathBuf::from(dir));
    }
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join("initdb"))
        .find(|p| p.is_file());
    if let Some(initdb) = on_path {
        // Debian links initdb into /usr/local/bin or /usr/bin; `postgres` sits beside the target.
        let real = std::fs::canonicalize(&initdb)?;
        if let Some(dir) = real.parent().filter(|d| d.join("postgres").is_file()) {
            return Ok(dir.to_path_buf());
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, bin)) => Ok(bin),
        None => bail!(
            "PostgreSQL server binaries (initdb, postgres) not found: install Debian's `postgresql` \
             package (scripts/test.sh does) or set CHRONOSHARD_PG_BIN to their directory"
        ),
    }
}
