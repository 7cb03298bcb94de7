//! The `rein` binary: `serve`, `run` and `check`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use futures::StreamExt;
use rein::contract::event::AgentEvent;
use rein::contract::message::Message;
use rein::{TerminalPrinter, TerminationReason};

use crate::deployment::{Deployment, StoreConfig};
use crate::service::{Strategy, Submission};
use crate::{assemble, serve};

/// Rein: serve agents over HTTP/SSE and AG-UI, run one from the command
/// line, or check a deployment file.
#[derive(Debug, Parser)]
#[command(name = "rein", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines (on stderr; level from `RUST_LOG`, default `warn`)
    /// are written: `text`, or `json` (one JSON object per line).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

/// How `rein run` runs the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RunMode {
    /// One run.
    Single,
    /// Auto mode: round after round on the thread.
    Auto,
}

/// The format of the log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, with the event's fields.
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serves the deployment's agents over HTTP until SIGINT/SIGTERM.
    Serve {
        /// The deployment file.
        #[arg(long)]
        config: PathBuf,
        /// The address to listen on (port 0: any free port).
        #[arg(long, default_value = "127.0.0.1:8080")]
        bind: String,
        /// Records every run's events as JSON lines in a new file in this
        /// directory, for `rein replay`.
        #[arg(long, value_name = "DIR")]
        record: Option<PathBuf>,
        /// Serves a non-loopback address without `server.auth`: anyone who
        /// can reach it may run the agents (and spend their keys).
        #[arg(long)]
        insecure_public: bool,
    },
    /// Evaluates an agent's stop conditions and detectors over recorded
    /// runs, offline: where each would have fired, and how often.
    Replay {
        /// The agent spec file (YAML or JSON), or a deployment file (then
        /// `--agent` picks the agent when it has several).
        #[arg(long)]
        config: PathBuf,
        /// The agent of a deployment file.
        #[arg(long)]
        agent: Option<String>,
        /// Prints JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Recordings (`rein serve --record`, or a `JsonlSink` file).
        #[arg(required = true)]
        recordings: Vec<PathBuf>,
    },
    /// Runs one message through an agent, streaming the answer to stdout.
    Run {
        /// The deployment file.
        #[arg(long)]
        config: PathBuf,
        /// The agent (optional when the file has one).
        #[arg(long)]
        agent: Option<String>,
        /// The thread to continue (durable store only).
        #[arg(long)]
        thread: Option<String>,
        /// `single` (one run) or `auto`: rounds on the thread until the
        /// automation policy (`--max-tokens`, `--max-experiments`) or auto
        /// mode's own stops say it is done.
        #[arg(long, value_enum, default_value_t = RunMode::Single)]
        mode: RunMode,
        /// Auto mode: stop once the thread's session has used this many
        /// tokens.
        #[arg(long, value_name = "N")]
        max_tokens: Option<u64>,
        /// Auto mode: stop after this many completed experiments (metric
        /// reports of the `automation` plugin).
        #[arg(long, value_name = "N")]
        max_experiments: Option<u64>,
        /// The message (its words are joined with spaces).
        #[arg(required = true)]
        message: Vec<String>,
    },
    /// Checks a deployment file without starting anything.
    Check {
        /// The deployment file.
        #[arg(long)]
        config: PathBuf,
        /// Also asks each model for one token, once: names the providers
        /// that do not answer, refuse the key or do not know the model.
        #[arg(long)]
        probe: bool,
    },
}

/// Runs the binary with the process's arguments.
pub fn main() -> ExitCode {
    main_with(&crate::App::new())
}

/// Runs the `rein` commands with the process's arguments, the deployment's
/// agents also getting `app`'s Rust tools and plugins ([`crate::App::main`]).
pub(crate) fn main_with(app: &crate::App) -> ExitCode {
    let cli = Cli::parse();
    let _spans = init_logs(cli.log_format);
    match cli.command {
        Command::Check { config, probe } => check(&config, probe, app),
        Command::Serve {
            config,
            bind,
            record,
            insecure_public,
        } => block_on(serve_command(
            &config,
            &bind,
            record.as_deref(),
            insecure_public,
            app,
        )),
        Command::Replay {
            config,
            agent,
            json,
            recordings,
        } => crate::replay::command(&config, agent.as_deref(), json, &recordings, app),
        Command::Run {
            config,
            agent,
            thread,
            mode,
            max_tokens,
            max_experiments,
            message,
        } => match mode {
            RunMode::Single if max_tokens.is_some() || max_experiments.is_some() => {
                eprintln!(
                    "rein: --max-tokens and --max-experiments are auto mode's budgets; add --mode auto"
                );
                ExitCode::from(2)
            }
            RunMode::Single => {
                block_on(run_command(&config, agent, thread, message.join(" "), app))
            }
            RunMode::Auto => {
                let mut policy = rein::auto::AutomationPolicy::default();
                policy.max_tokens = max_tokens;
                policy.max_experiments = max_experiments;
                block_on(auto_command(
                    &config,
                    agent,
                    thread,
                    message.join(" "),
                    policy,
                    app,
                ))
            }
        },
    }
}

/// Installs the log subscriber: lines on stderr filtered by `RUST_LOG`
/// and, with the `otlp` feature and an OTLP endpoint in the environment,
/// the GenAI spans exported over OTLP. The guard flushes the spans not yet
/// sent when dropped (at the end of `main`).
fn init_logs(format: LogFormat) -> Option<Box<dyn std::any::Any>> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match format {
        LogFormat::Json => lines.json().flatten_event(true).with_filter(filter).boxed(),
        // Colour codes only for a terminal: logs piped to a file or
        // another program, or between `rein run`'s lines, stay plain text.
        LogFormat::Text => lines
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_filter(filter)
            .boxed(),
    };
    let registry = tracing_subscriber::registry().with(lines);
    #[cfg(feature = "otlp")]
    if let Some(service) = otlp_service() {
        // The spans are exported whatever RUST_LOG lets through to stderr.
        let spans = tracing_subscriber::filter::Targets::new()
            .with_target(rein::telemetry::TARGET, tracing::Level::INFO);
        match rein::otel::Otlp::new(service).layer() {
            Ok((layer, guard)) => {
                let _ = registry.with(layer.with_filter(spans)).try_init();
                return Some(Box::new(guard));
            }
            Err(e) => eprintln!("rein: not exporting traces: {e}"),
        }
    }
    let _ = registry.try_init();
    None
}

/// The `service.name` to export spans as (`OTEL_SERVICE_NAME`, default
/// `rein`), when an OTLP endpoint is set.
#[cfg(feature = "otlp")]
fn otlp_service() -> Option<String> {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty());
    (set("OTEL_EXPORTER_OTLP_ENDPOINT") || set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")).then(|| {
        std::env::var("OTEL_SERVICE_NAME")
            .ok()
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| "rein".to_owned())
    })
}

fn block_on(command: impl Future<Output = ExitCode>) -> ExitCode {
    match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime.block_on(command),
        Err(e) => {
            eprintln!("rein: cannot start the async runtime: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A new recording file in `dir`: `rein-<unix ms>-<pid>.jsonl`.
fn recorder(dir: &Path) -> Result<(std::sync::Arc<dyn rein::events::EventSink>, PathBuf), String> {
    std::fs::create_dir_all(dir).map_err(|e| {
        format!(
            "--record {}: cannot create the directory: {e}",
            dir.display()
        )
    })?;
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    let path = dir.join(format!("rein-{ms}-{}.jsonl", std::process::id()));
    let sink = rein::events::JsonlSink::create(&path)
        .map_err(|e| format!("--record: cannot create {}: {e}", path.display()))?;
    Ok((std::sync::Arc::new(sink), path))
}

/// Loads a file, printing its errors (`FILE:LINE:COLUMN: message`) to
/// `out` on failure.
fn load(config: &Path, out: &mut dyn Write, app: &crate::App) -> Option<Deployment> {
    match Deployment::load_with(config, &app.extras()) {
        Ok(d) => Some(d),
        Err(e) => {
            for line in e.lines() {
                let _ = writeln!(out, "{line}");
            }
            None
        }
    }
}

/// A provider's limits in a line: what one window allows.
fn describe_limits(limits: &rein::limits::ProviderLimits) -> String {
    let window = limits.window_duration();
    let per = if window == std::time::Duration::from_secs(60) {
        "per minute".to_owned()
    } else {
        format!("per {} ms window", window.as_millis())
    };
    let mut parts = Vec::new();
    if let Some(n) = limits.requests_per_window() {
        parts.push(format!("{n} requests {per}"));
    }
    if let Some(n) = limits.tokens_per_window() {
        parts.push(format!("{n} tokens {per}"));
    }
    if let Some(n) = limits.max_concurrent {
        parts.push(format!("{n} at once"));
    }
    format!("at most {}", parts.join(", "))
}

fn check(config: &Path, probe: bool, app: &crate::App) -> ExitCode {
    let mut stdout = std::io::stdout();
    let Some(deployment) = load(config, &mut stdout, app) else {
        return ExitCode::FAILURE;
    };
    for (id, provider) in &deployment.providers {
        if let Some(limits) = provider.limits().filter(|l| l.is_limited()) {
            println!("provider \"{id}\": {}", describe_limits(limits));
        }
    }
    for (id, model) in &deployment.models {
        if !model.fallbacks.is_empty() {
            println!(
                "model \"{id}\": falls back to {}",
                model.fallbacks.join(", then ")
            );
        }
    }
    for agent in &deployment.agents {
        let rules = &agent.spec.approvals;
        if rules.is_empty() {
            continue;
        }
        let tools = crate::deployment::agent_tool_names(agent);
        println!(
            "agent \"{}\": {} approval rule(s), first match decides, no match runs the call:",
            agent.spec.id,
            rules.len()
        );
        for (i, rule) in rules.iter().enumerate() {
            let matched: Vec<&str> = tools
                .iter()
                .filter(|t| rule.matches_tool(t))
                .map(String::as_str)
                .collect();
            let timeout = rule
                .timeout_seconds
                .map(|s| format!(", timeout {s} s then {:?}", rule.on_timeout).to_lowercase())
                .unwrap_or_default();
            println!(
                "  [{i}] {}{timeout} (tools: {})",
                rule.describe(),
                matched.join(", ")
            );
        }
    }
    if !probe {
        println!("ok");
        return ExitCode::SUCCESS;
    }
    block_on(async move {
        let probes = crate::probe::probe(&deployment).await;
        let failed = probes.iter().filter(|p| p.failure.is_some()).count();
        for probe in &probes {
            println!("{probe}");
        }
        if failed == 0 {
            println!("ok");
            ExitCode::SUCCESS
        } else {
            println!("{failed} of {} models failed the probe", probes.len());
            ExitCode::FAILURE
        }
    })
}

async fn serve_command(
    config: &Path,
    bind: &str,
    record: Option<&Path>,
    insecure_public: bool,
    app: &crate::App,
) -> ExitCode {
    let Some(mut deployment) = load(config, &mut std::io::stderr(), app) else {
        return ExitCode::FAILURE;
    };
    deployment.server.insecure_public = insecure_public;
    if let Err(e) = crate::http::guard::Guard::new(&deployment.server) {
        eprintln!("rein: {e}");
        return ExitCode::FAILURE;
    }
    if deployment.server.auth.is_none() && !insecure_public && !loopback_bind(bind) {
        eprintln!(
            "rein: refusing to serve {bind} without authentication: anyone who can reach it could run the agents and spend their keys; set server.auth (bearer tokens), bind 127.0.0.1, or pass --insecure-public"
        );
        return ExitCode::FAILURE;
    }
    let assembled = match assemble::start_with(&deployment, app).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rein: {e}");
            return ExitCode::FAILURE;
        }
    };
    let listener = match tokio::net::TcpListener::bind(bind).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("rein: cannot listen on {bind}: {e}");
            assembled.shutdown_mcp().await;
            return ExitCode::FAILURE;
        }
    };
    let addr = match listener.local_addr() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rein: {e}");
            assembled.shutdown_mcp().await;
            return ExitCode::FAILURE;
        }
    };
    let service = assembled.service(&deployment.server);
    if let Some(dir) = record {
        match recorder(dir) {
            Ok((sink, path)) => {
                eprintln!("rein: recording runs to {}", path.display());
                service.record_events(sink);
            }
            Err(message) => {
                eprintln!("rein: {message}");
                assembled.shutdown_mcp().await;
                return ExitCode::FAILURE;
            }
        }
    }
    let stop = signal();
    println!("listening on http://{addr}");
    let _ = std::io::stdout().flush();
    let served = serve(listener, service, deployment.server.clone(), stop).await;
    // Runs have ended; the MCP servers go last.
    assembled.shutdown_mcp().await;
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rein: the server failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Whether `bind` (`HOST:PORT`) listens on loopback only.
fn loopback_bind(bind: &str) -> bool {
    match bind.parse::<std::net::SocketAddr>() {
        Ok(addr) => addr.ip().is_loopback(),
        // A host name: only `localhost` is known to be loopback.
        Err(_) => bind
            .rsplit_once(':')
            .is_some_and(|(host, _)| host.eq_ignore_ascii_case("localhost")),
    }
}

/// A future that completes on SIGINT or SIGTERM. The handlers are
/// installed here, before the future is first polled, so a signal that
/// arrives right after `serve` prints its line is not missed (it would
/// otherwise end the process with the default action).
fn signal() -> impl Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let interrupt = signal(SignalKind::interrupt());
        let terminate = signal(SignalKind::terminate());
        async move {
            match (interrupt, terminate) {
                (Ok(mut interrupt), Ok(mut terminate)) => {
                    tokio::select! {
                        _ = interrupt.recv() => {}
                        _ = terminate.recv() => {}
                    }
                }
                _ => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

async fn run_command(
    config: &Path,
    agent: Option<String>,
    thread: Option<String>,
    message: String,
    app: &crate::App,
) -> ExitCode {
    let Some(deployment) = load(config, &mut std::io::stderr(), app) else {
        return ExitCode::FAILURE;
    };
    if thread.is_some() && deployment.store == StoreConfig::Memory {
        eprintln!(
            "rein: note: with `store: memory` every `rein run` starts with an empty thread; --thread continues a thread only with a durable store"
        );
    }
    let assembled = match assemble::start_with(&deployment, app).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rein: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Through the service, as a client of it: in distributed mode the run
    // is a row of the shared database, run under this process's lease
    // (renewed by its heartbeat) or by whichever process holds the thread.
    let service = assembled.service(&deployment.server);
    let thread = thread.unwrap_or_else(|| format!("cli-{}", std::process::id()));
    let submission = Submission {
        agent_id: agent,
        messages: vec![Message::user(message)],
        strategy: Strategy::Reject,
        ..Submission::default()
    };
    let entry = match service.submit(&thread, submission).await {
        Ok(submitted) => service.live(&submitted).await,
        Err(e) => Err(e),
    };
    let entry = match entry {
        Ok(entry) => entry,
        Err(e) => {
            eprintln!("rein: {e}");
            service.shutdown().await;
            assembled.shutdown_mcp().await;
            return ExitCode::FAILURE;
        }
    };
    let printer = TerminalPrinter::new();
    let mut ctrl_c = std::pin::pin!(signal());
    let mut events = std::pin::pin!(crate::http::run_log(entry.clone(), 0));
    let mut interrupted = false;
    let mut prompter = crate::prompt::Prompter::new();
    loop {
        tokio::select! {
            next = events.next() => match next {
                Some(logged) => {
                    if let Some(event) = logged.event() {
                        printer.print(event);
                        match event {
                            AgentEvent::ApprovalRequested { .. } => {
                                if let Some(pending) = rein::approvals::pending_of(event) {
                                    prompter.requested(pending);
                                }
                            }
                            AgentEvent::ApprovalDecided { call_id, .. } => prompter.decided(call_id),
                            _ => {}
                        }
                    }
                }
                None => break,
            },
            line = prompter.next_line() => prompter.answer(&service, line).await,
            _ = &mut ctrl_c, if !interrupted => {
                interrupted = true;
                if let Err(e) = service.cancel_run(&entry.run_id).await {
                    eprintln!("rein: could not cancel the run: {e}");
                }
            }
        }
    }
    let record = entry.finished().await;
    service.shutdown().await;
    assembled.shutdown_mcp().await;
    if interrupted {
        return ExitCode::from(130);
    }
    match record.termination {
        // A stop that errors caused is a failure, as an error is.
        Some(TerminationReason::Stopped(r))
            if matches!(r.code.as_str(), "consecutive_errors" | "error_rate") =>
        {
            ExitCode::FAILURE
        }
        Some(TerminationReason::NaturalEnd | TerminationReason::Stopped(_)) => ExitCode::SUCCESS,
        Some(TerminationReason::Cancelled) => ExitCode::from(130),
        Some(TerminationReason::Error(_)) | None => ExitCode::FAILURE,
    }
}

/// `rein run --mode auto`: an auto-mode session on the thread, in this
/// process, its rounds and progress printed as they happen. The policy is
/// only the budgets given (none: auto mode's own stops and ceiling); it is
/// not stored.
async fn auto_command(
    config: &Path,
    agent: Option<String>,
    thread: Option<String>,
    message: String,
    policy: rein::auto::AutomationPolicy,
    app: &crate::App,
) -> ExitCode {
    let Some(deployment) = load(config, &mut std::io::stderr(), app) else {
        return ExitCode::FAILURE;
    };
    if deployment.store != StoreConfig::Memory {
        eprintln!(
            "rein: --mode auto runs its session in this process, and a durable store is shared with a fleet whose claims on the thread its rounds would bypass; use a deployment with `store: memory`"
        );
        return ExitCode::FAILURE;
    }
    let assembled = match assemble::start_with(&deployment, app).await {
        Ok(a) => a,
        Err(e) => {
            eprintln!("rein: {e}");
            return ExitCode::FAILURE;
        }
    };
    let thread = thread.unwrap_or_else(|| format!("cli-{}", std::process::id()));
    let mut request = rein::RunRequest::new(&thread, vec![Message::user(message)]);
    if let Some(agent) = agent {
        request = request.with_agent_id(agent);
    }
    let token = rein::CancellationToken::new();
    request = request.with_cancellation(token.clone());
    let sink = std::sync::Arc::new(PrintingSink(TerminalPrinter::new()));
    let session = assembled.runtime.auto_run(request, Some(policy), sink);
    let mut session = std::pin::pin!(session);
    let mut ctrl_c = std::pin::pin!(signal());
    let mut interrupted = false;
    let outcome = loop {
        tokio::select! {
            outcome = &mut session => break outcome,
            _ = &mut ctrl_c, if !interrupted => {
                interrupted = true;
                token.cancel();
            }
        }
    };
    assembled.shutdown_mcp().await;
    let result = match outcome {
        Ok(result) => result,
        Err(e) => {
            eprintln!("rein: {e}");
            return ExitCode::FAILURE;
        }
    };
    let budget = result
        .max_tokens
        .map(|max| format!(" of {max}"))
        .unwrap_or_default();
    // A status line, on stderr with the printer's others; the answers are
    // on stdout.
    eprintln!(
        "[auto] stopped: {} · {} round{} · {}{budget} session tokens",
        result.stop_reason,
        result.rounds,
        if result.rounds == 1 { "" } else { "s" },
        result.tokens_used_session
    );
    if interrupted {
        return ExitCode::from(130);
    }
    let failed = result
        .runs
        .last()
        .is_some_and(|run| matches!(run.termination, TerminationReason::Error(_)))
        || result.stop_reason.starts_with("run error");
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// Prints every event as `rein run` does.
struct PrintingSink(TerminalPrinter);

impl rein::events::EventSink for PrintingSink {
    fn emit(&self, event: AgentEvent) {
        self.0.print(&event);
    }
}
