//! The `rein` binary: `rein serve | run | check --config FILE`.

fn main() -> std::process::ExitCode {
    rein_server::cli::main()
}
