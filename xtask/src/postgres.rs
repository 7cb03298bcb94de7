//! `cargo xtask postgres start [--private]|stop|restart|status`: a
//! PostgreSQL cluster for the durable-mode tests and benchmarks.
//!
//! PostgreSQL refuses to run as root, so as root a cluster belongs to an
//! unprivileged user (`REIN_PG_USER`, default `postgres`) and every command
//! runs as that user; otherwise it belongs to the current user. The
//! PostgreSQL programs are those in `REIN_PG_BIN` if it is set, else in the
//! newest `/usr/lib/postgresql/<version>/bin` (where Debian's packages put
//! them, off `PATH`), else those on `PATH`. A cluster listens on 127.0.0.1
//! only, on a free port, and its unix socket is in its own directory.
//! `start` prints `REIN_DATABASE_URL=<url>` as its last line (also when the
//! cluster already runs); `stop` stops a cluster through its PID file
//! (`pg_ctl stop`, which signals the postmaster's PID).
//!
//! - **The shared cluster** (`start`), for developers: one per user, under
//!   that user's `$HOME/.cache/rein-pg`, its data and its port (chosen at
//!   the first start, kept in `port`) kept between runs. Every checkout on
//!   the machine that starts it uses the same one, tables included.
//! - **A private cluster** (`start --private`), for CI: a fresh one per
//!   call, under `$HOME/.cache/rein-pg-runs/<pid>-<nanoseconds>` (`initdb
//!   --no-sync`, C locale, `fsync=off`), on a port of its own, so no other
//!   job on the machine can stop it or touch its tables. It prints
//!   `REIN_PG_DIR=<dir>` on the line before the URL. With `REIN_PG_DIR` set
//!   in the environment, `stop`, `restart` and `status` act on that cluster
//!   instead of the shared one, and `stop` also deletes its directory once
//!   its postmaster is gone (the PID read from its PID file is checked; it
//!   is killed if `pg_ctl stop` could not end it). A private start that
//!   fails removes what it made, and it first deletes the directories of
//!   earlier private clusters that no longer run and whose creating process
//!   is gone (a job killed before its `stop`).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The user the clusters run as, if commands must switch to it, and that
/// user's home directory.
fn owner() -> (Option<String>, PathBuf) {
    let root = Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false);
    if root {
        let user = std::env::var("REIN_PG_USER").unwrap_or_else(|_| "postgres".to_owned());
        let home = Command::new("sh")
            .args(["-c", &format!("getent passwd {user} | cut -d: -f6")])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_default();
        (Some(user), PathBuf::from(home))
    } else {
        (
            None,
            PathBuf::from(std::env::var("HOME").unwrap_or_default()),
        )
    }
}

/// The PostgreSQL program `name`: in `REIN_PG_BIN`, else in the newest
/// `/usr/lib/postgresql/<version>/bin` that has it, else on `PATH`.
fn pg_program(name: &str) -> String {
    if let Ok(dir) = std::env::var("REIN_PG_BIN")
        && !dir.is_empty()
    {
        return Path::new(&dir).join(name).display().to_string();
    }
    let newest = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version: u32 = entry.file_name().to_str()?.parse().ok()?;
            let program = entry.path().join("bin").join(name);
            program.exists().then_some((version, program))
        })
        .max_by_key(|(version, _)| *version);
    match newest {
        Some((_, program)) => program.display().to_string(),
        None => name.to_owned(),
    }
}

/// A command run as the cluster's owner.
fn as_owner(user: &Option<String>, program: &str) -> Command {
    match user {
        Some(user) => {
            let mut c = Command::new("runuser");
            c.args(["-u", user, "--", program]);
            c
        }
        None => Command::new(program),
    }
}

fn run(mut command: Command, what: &str) -> Result<String, String> {
    let out = command
        .output()
        .map_err(|e| format!("{what}: cannot run it: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "{what} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Whether the process `pid` runs: it exists (signal 0, sent as the
/// current user, who may signal the processes it made; as root, any) and
/// is not a zombie (ended, but not yet reaped by its parent: a container's
/// init may take its time).
fn alive(pid: u32) -> bool {
    if Path::new("/proc/self/stat").exists() {
        return std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| {
                stat.rsplit_once(") ")
                    .is_none_or(|(_, rest)| !rest.starts_with('Z'))
            })
            .unwrap_or(false);
    }
    Command::new("sh")
        .args(["-c", &format!("kill -0 {pid} 2>/dev/null")])
        .status()
        .map(|s| s.success())
        .unwrap_or(true)
}

/// Waits up to `within` for the process `pid` to end; whether it did.
fn gone(pid: u32, within: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + within;
    while alive(pid) {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    true
}

/// Whether the process `pid` is a PostgreSQL one (not a process that got
/// its PID since); without `/proc`, assumed.
fn is_postgres(pid: u32) -> bool {
    if !Path::new("/proc/self").exists() {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|comm| comm.trim() == "postgres")
        .unwrap_or(false)
}

/// A free TCP port on 127.0.0.1 (free when asked: a private start retries
/// with another if PostgreSQL cannot bind it).
fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// Where the private clusters live, under the owner's home.
fn private_root(home: &Path) -> PathBuf {
    home.join(".cache/rein-pg-runs")
}

/// Whether `name` is a private cluster's directory name (`<pid>-<nanos>`);
/// returns its creator's PID.
fn private_creator(name: &str) -> Option<u32> {
    let (pid, nanos) = name.split_once('-')?;
    if nanos.is_empty() || !nanos.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    pid.parse().ok()
}

struct Cluster {
    user: Option<String>,
    /// Its directory: the data (`data`), the port (`port`), the log
    /// (`server.log`) and the unix socket.
    dir: PathBuf,
    private: bool,
}

impl Cluster {
    /// The private cluster named by `REIN_PG_DIR`, else the shared one.
    fn current() -> Result<Self, String> {
        let (user, home) = owner();
        match std::env::var("REIN_PG_DIR") {
            Ok(dir) if !dir.is_empty() => {
                let dir = PathBuf::from(dir);
                // Only ever a directory a private start made: `stop` deletes it.
                let inside = dir.parent() == Some(private_root(&home).as_path())
                    && dir
                        .file_name()
                        .and_then(|n| n.to_str())
                        .and_then(private_creator)
                        .is_some();
                if !inside {
                    return Err(format!(
                        "REIN_PG_DIR={} is not a private cluster's directory (one under {})",
                        dir.display(),
                        private_root(&home).display()
                    ));
                }
                Ok(Self {
                    user,
                    dir,
                    private: true,
                })
            }
            _ => Ok(Self {
                user,
                dir: home.join(".cache/rein-pg"),
                private: false,
            }),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn port_file(&self) -> PathBuf {
        self.dir.join("port")
    }

    fn log(&self) -> PathBuf {
        self.dir.join("server.log")
    }

    fn url(&self, port: u16) -> String {
        format!("postgres://rein@127.0.0.1:{port}/rein")
    }

    fn pg_ctl(&self, action: &str) -> Command {
        let mut c = as_owner(&self.user, &pg_program("pg_ctl"));
        c.arg(action).arg("-D").arg(self.data());
        c
    }

    fn running(&self) -> bool {
        self.pg_ctl("status")
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    }

    fn port(&self) -> Option<u16> {
        std::fs::read_to_string(self.port_file())
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    fn write_port(&self, port: u16) -> Result<(), String> {
        let mut write = as_owner(&self.user, "sh");
        write.args([
            "-c",
            &format!("echo {port} > '{}'", self.port_file().display()),
        ]);
        run(write, "writing the port file").map(|_| ())
    }

    /// The postmaster's PID, from its PID file.
    fn postmaster_pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.data().join("postmaster.pid"))
            .ok()?
            .lines()
            .next()?
            .trim()
            .parse()
            .ok()
    }

    fn init(&self) -> Result<(), String> {
        if self.data().join("PG_VERSION").exists() {
            return Ok(());
        }
        let mut mkdir = as_owner(&self.user, "mkdir");
        mkdir.arg("-p").arg(&self.dir);
        run(mkdir, "mkdir")?;
        println!(
            "xtask: creating a PostgreSQL cluster in {}",
            self.data().display()
        );
        let mut initdb = as_owner(&self.user, &pg_program("initdb"));
        initdb.arg("-D").arg(self.data()).args([
            "-A",
            "trust",
            "-U",
            "rein",
            "-E",
            "UTF8",
            "--no-instructions",
        ]);
        if self.private {
            // Thrown away after the run: no fsync, and a locale that does
            // not depend on the machine's environment.
            initdb.args(["--no-sync", "--locale=C"]);
        }
        run(initdb, "initdb").map(|_| ())
    }

    /// Starts the postmaster on `port` (it must not run).
    fn start_postmaster(&self, port: u16) -> Result<(), String> {
        let options = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -k {} -c max_connections=200 -c fsync=off",
            self.dir.display()
        );
        let mut start = self.pg_ctl("start");
        start
            .arg("-l")
            .arg(self.log())
            .args(["-w", "-t", "60", "-o", &options]);
        run(start, "pg_ctl start").map(|_| ())
    }

    /// Creates the database the URL names.
    fn createdb(&self, port: u16) -> Result<(), String> {
        let mut create = as_owner(&self.user, &pg_program("createdb"));
        create.args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "rein",
            "rein",
        ]);
        run(create, "createdb").map(|_| ())
    }

    /// Starts the shared cluster (created at its first start).
    fn start(&self) -> Result<u16, String> {
        self.init()?;
        let port = match self.port() {
            Some(port) => port,
            None => {
                let port = free_port()?;
                self.write_port(port)?;
                port
            }
        };
        if !self.running() {
            self.start_postmaster(port)?;
        }
        // It fails when the database exists: fine.
        let _ = self.createdb(port);
        Ok(port)
    }

    /// Creates and starts a new private cluster.
    fn start_private() -> Result<(Self, u16), String> {
        let (user, home) = owner();
        let root = private_root(&home);
        let mut mkdir = as_owner(&user, "mkdir");
        mkdir.arg("-p").arg(&root);
        run(mkdir, "mkdir")?;
        reap(&user, &root);
        // A name no other start uses: this process's id and the time; the
        // directory is made without `-p`, so a name taken fails.
        let mut cluster = None;
        for _ in 0..10 {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            let dir = root.join(format!("{}-{nanos}", std::process::id()));
            let mut mkdir = as_owner(&user, "mkdir");
            mkdir.arg(&dir);
            if run(mkdir, "mkdir").is_ok() {
                cluster = Some(Self {
                    user: user.clone(),
                    dir,
                    private: true,
                });
                break;
            }
        }
        let cluster =
            cluster.ok_or_else(|| format!("could not make a directory in {}", root.display()))?;
        match cluster.init_and_start() {
            Ok(port) => Ok((cluster, port)),
            Err(error) => {
                if let Err(more) = cluster.remove() {
                    eprintln!("xtask: {more}");
                }
                Err(error)
            }
        }
    }

    fn init_and_start(&self) -> Result<u16, String> {
        self.init()?;
        let mut attempts = 0;
        let port = loop {
            attempts += 1;
            let port = free_port()?;
            self.write_port(port)?;
            match self.start_postmaster(port) {
                Ok(()) => break port,
                Err(error) => {
                    // Another process took the port between our look and
                    // the postmaster's bind: another port.
                    let log = std::fs::read_to_string(self.log()).unwrap_or_default();
                    let taken = log.contains("could not bind")
                        || log.contains("could not create any TCP/IP sockets");
                    if !taken || attempts == 5 {
                        return Err(format!("{error}\n{log}"));
                    }
                    let _ = std::fs::write(self.log(), "");
                }
            }
        };
        self.createdb(port)?;
        Ok(port)
    }

    /// A fast restart (clients are disconnected), for the tests that check
    /// the service rides one out.
    fn restart(&self) -> Result<(), String> {
        if !self.running() {
            return Err(format!(
                "the PostgreSQL cluster in {} is not running; `cargo xtask postgres start` first",
                self.dir.display()
            ));
        }
        let mut restart = self.pg_ctl("restart");
        restart
            .arg("-l")
            .arg(self.log())
            .args(["-m", "fast", "-w", "-t", "60"]);
        run(restart, "pg_ctl restart").map(|_| println!("xtask: PostgreSQL restarted"))
    }

    fn stop(&self) -> Result<(), String> {
        if self.private {
            return self
                .remove()
                .map(|()| println!("xtask: PostgreSQL stopped, {} deleted", self.dir.display()));
        }
        if !self.running() {
            println!("xtask: the PostgreSQL cluster is not running");
            return Ok(());
        }
        let mut stop = self.pg_ctl("stop");
        stop.args(["-m", "fast", "-w"]);
        run(stop, "pg_ctl stop").map(|_| println!("xtask: PostgreSQL stopped"))
    }

    /// Stops a private cluster through its postmaster's PID and deletes
    /// its directory; fails if either is left.
    fn remove(&self) -> Result<(), String> {
        let pid = self.postmaster_pid();
        if self.running() {
            let mut stop = self.pg_ctl("stop");
            stop.args(["-m", "fast", "-w", "-t", "30"]);
            if let Err(error) = run(stop, "pg_ctl stop") {
                eprintln!("xtask: {error}; stopping it at once");
                let mut stop = self.pg_ctl("stop");
                stop.args(["-m", "immediate", "-w", "-t", "30"]);
                let _ = run(stop, "pg_ctl stop -m immediate");
            }
        }
        if let Some(pid) = pid {
            // `pg_ctl stop -w` returns once the PID file is gone, a moment
            // before the process; one that does not end is killed (its
            // backends exit with it).
            if !gone(pid, std::time::Duration::from_secs(10)) {
                if is_postgres(pid) {
                    let _ = Command::new("sh")
                        .args(["-c", &format!("kill -KILL {pid}")])
                        .status();
                }
                if !gone(pid, std::time::Duration::from_secs(5)) {
                    return Err(format!(
                        "the postmaster of {} (PID {pid}) is still running",
                        self.dir.display()
                    ));
                }
            }
        }
        let mut rm = as_owner(&self.user, "rm");
        rm.arg("-rf").arg(&self.dir);
        run(rm, "rm")?;
        if self.dir.exists() {
            return Err(format!("{} is still there", self.dir.display()));
        }
        Ok(())
    }
}

/// Deletes the private clusters under `root` that do not run and whose
/// creating process is gone: what a job killed before its `stop` left.
fn reap(user: &Option<String>, root: &Path) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        let Some(creator) = entry.file_name().to_str().and_then(private_creator) else {
            continue;
        };
        let cluster = Cluster {
            user: user.clone(),
            dir: entry.path(),
            private: true,
        };
        // `pg_ctl status` counts a killed postmaster that is not reaped yet.
        let running = cluster.running() && cluster.postmaster_pid().is_none_or(alive);
        if alive(creator) || running {
            continue;
        }
        let mut rm = as_owner(user, "rm");
        rm.arg("-rf").arg(&cluster.dir);
        if run(rm, "rm").is_ok() {
            println!(
                "xtask: deleted {}, a private cluster left behind",
                cluster.dir.display()
            );
        }
    }
}

const USAGE: &str = "usage: cargo xtask postgres start [--private]|stop|restart|status
  (with REIN_PG_DIR set, stop|restart|status act on that private cluster)";

pub(crate) fn main(args: &[String]) -> Result<(), String> {
    match (
        args.first().map(String::as_str),
        args.get(1).map(String::as_str),
    ) {
        (Some("start"), None) => {
            // The shared cluster, whatever REIN_PG_DIR says.
            let (user, home) = owner();
            let cluster = Cluster {
                user,
                dir: home.join(".cache/rein-pg"),
                private: false,
            };
            let port = cluster.start()?;
            println!("xtask: PostgreSQL serving {}", cluster.data().display());
            println!("REIN_DATABASE_URL={}", cluster.url(port));
            Ok(())
        }
        (Some("start"), Some("--private")) if args.len() == 2 => {
            let (cluster, port) = Cluster::start_private()?;
            println!(
                "xtask: private PostgreSQL serving {} (PID {})",
                cluster.data().display(),
                cluster
                    .postmaster_pid()
                    .map_or_else(|| "?".to_owned(), |p| p.to_string())
            );
            println!("REIN_PG_DIR={}", cluster.dir.display());
            println!("REIN_DATABASE_URL={}", cluster.url(port));
            Ok(())
        }
        (Some("stop"), None) => Cluster::current()?.stop(),
        (Some("restart"), None) => Cluster::current()?.restart(),
        (Some("status"), None) => {
            let cluster = Cluster::current()?;
            match (cluster.running(), cluster.port()) {
                (true, Some(port)) => println!("running: REIN_DATABASE_URL={}", cluster.url(port)),
                _ => println!("not running"),
            }
            Ok(())
        }
        _ => Err(USAGE.to_owned()),
    }
}
