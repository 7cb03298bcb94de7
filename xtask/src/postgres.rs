//! `cargo xtask postgres start|stop|status`: a private PostgreSQL cluster for
//! the durable-mode tests and benchmarks.
//!
//! PostgreSQL refuses to run as root, so as root the cluster belongs to an
//! unprivileged user (`REIN_PG_USER`, default `postgres`) and every command
//! runs as that user; otherwise it belongs to the current user. Its data
//! lives under that user's `$HOME/.cache/rein-pg`; it listens on 127.0.0.1
//! only, on a free port chosen at the first start and kept in
//! `port`. `start` prints `REIN_DATABASE_URL=<url>` as its last line (also
//! when the cluster already runs); `stop` stops it through its PID file
//! (`pg_ctl stop`, which signals the postmaster's PID).

use std::path::{Path, PathBuf};
use std::process::Command;

/// The user the cluster runs as, and whether commands must switch to it.
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

struct Cluster {
    user: Option<String>,
    dir: PathBuf,
}

impl Cluster {
    fn new() -> Self {
        let (user, home) = owner();
        Self {
            user,
            dir: home.join(".cache/rein-pg"),
        }
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn port_file(&self) -> PathBuf {
        self.dir.join("port")
    }

    fn url(&self, port: u16) -> String {
        format!("postgres://rein@127.0.0.1:{port}/rein")
    }

    fn running(&self) -> bool {
        let mut c = as_owner(&self.user, "pg_ctl");
        c.arg("status").arg("-D").arg(self.data());
        c.output().map(|o| o.status.success()).unwrap_or(false)
    }

    fn port(&self) -> Option<u16> {
        std::fs::read_to_string(self.port_file())
            .ok()?
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
        let mut initdb = as_owner(&self.user, "initdb");
        initdb.arg("-D").arg(self.data()).args([
            "-A",
            "trust",
            "-U",
            "rein",
            "-E",
            "UTF8",
            "--no-instructions",
        ]);
        run(initdb, "initdb").map(|_| ())
    }

    fn start(&self) -> Result<u16, String> {
        self.init()?;
        let port = match self.port() {
            Some(port) => port,
            None => {
                let port = std::net::TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .map_err(|e| format!("no free port: {e}"))?
                    .port();
                let mut write = as_owner(&self.user, "sh");
                write.args([
                    "-c",
                    &format!("echo {port} > '{}'", self.port_file().display()),
                ]);
                run(write, "writing the port file")?;
                port
            }
        };
        if !self.running() {
            let options = format!(
                "-p {port} -c listen_addresses=127.0.0.1 -k {} -c max_connections=200 -c fsync=off",
                self.dir.display()
            );
            let mut start = as_owner(&self.user, "pg_ctl");
            start
                .arg("start")
                .arg("-D")
                .arg(self.data())
                .arg("-l")
                .arg(self.dir.join("server.log"))
                .args(["-w", "-t", "60", "-o", &options]);
            run(start, "pg_ctl start")?;
        }
        // The database the URL names (createdb fails if it exists: fine).
        let mut create = as_owner(&self.user, "createdb");
        create.args([
            "-h",
            "127.0.0.1",
            "-p",
            &port.to_string(),
            "-U",
            "rein",
            "rein",
        ]);
        let _ = create.output();
        Ok(port)
    }

    /// A fast restart (clients are disconnected), for the tests that check
    /// the service rides one out.
    fn restart(&self) -> Result<(), String> {
        if !self.running() {
            return Err(
                "the PostgreSQL cluster is not running; `cargo xtask postgres start` first"
                    .to_owned(),
            );
        }
        let mut restart = as_owner(&self.user, "pg_ctl");
        restart
            .arg("restart")
            .arg("-D")
            .arg(self.data())
            .arg("-l")
            .arg(self.dir.join("server.log"))
            .args(["-m", "fast", "-w", "-t", "60"]);
        run(restart, "pg_ctl restart").map(|_| println!("xtask: PostgreSQL restarted"))
    }

    fn stop(&self) -> Result<(), String> {
        if !self.running() {
            println!("xtask: the PostgreSQL cluster is not running");
            return Ok(());
        }
        let mut stop = as_owner(&self.user, "pg_ctl");
        stop.arg("stop")
            .arg("-D")
            .arg(self.data())
            .args(["-m", "fast", "-w"]);
        run(stop, "pg_ctl stop").map(|_| println!("xtask: PostgreSQL stopped"))
    }
}

pub(crate) fn main(args: &[String]) -> Result<(), String> {
    let cluster = Cluster::new();
    match args.first().map(String::as_str) {
        Some("start") => {
            let port = cluster.start()?;
            println!("xtask: PostgreSQL 15 serving {}", data_dir(&cluster.data()));
            println!("REIN_DATABASE_URL={}", cluster.url(port));
            Ok(())
        }
        Some("stop") => cluster.stop(),
        Some("restart") => cluster.restart(),
        Some("status") => {
            match (cluster.running(), cluster.port()) {
                (true, Some(port)) => println!("running: REIN_DATABASE_URL={}", cluster.url(port)),
                _ => println!("not running"),
            }
            Ok(())
        }
        _ => Err("usage: cargo xtask postgres start|stop|restart|status".to_owned()),
    }
}

fn data_dir(path: &Path) -> String {
    path.display().to_string()
}
