//! A `rein` binary of your own: the deployment file's agents, plus a typed
//! tool written in Rust (`lookup_order`).
//!
//! ```text
//! cargo run -p rein-server --example rust_tools -- serve --config crates/server/examples/rust-tools.yaml
//! curl -s 'http://127.0.0.1:8080/v1/threads/t1/runs?wait=true' \
//!      -H 'content-type: application/json' \
//!      -d '{"messages": [{"role": "user", "content": "Where is order 42?"}]}'
//! ```
//!
//! It takes every `rein` command (`serve`, `run`, `check`, `replay`) and
//! flag; `rein check` on the same file fails, naming `lookup_order` as an
//! unknown tool, because only this program knows it.

use std::process::ExitCode;

use rein::contract::tool::ToolError;
use rein::schemars;
use rein::tools::tool_fn;
use rein_server::App;

/// `lookup_order`'s arguments; the model sees their JSON Schema.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Lookup {
    /// The order's number, e.g. 42.
    order_id: u32,
}

/// What `lookup_order` answers, as JSON.
#[derive(serde::Serialize)]
struct Order {
    order_id: u32,
    status: &'static str,
    ships_in_days: u32,
}

fn main() -> ExitCode {
    app().main()
}

/// The `rein` commands plus `lookup_order` (the tests serve this too).
pub(crate) fn app() -> App {
    let lookup = tool_fn(
        "lookup_order",
        "Looks an order up by its number: its status and when it ships.",
        |args: Lookup, _ctx| async move {
            if args.order_id == 0 {
                return Err(ToolError::new(
                    "order 0 does not exist; order numbers start at 1",
                ));
            }
            Ok(Order {
                order_id: args.order_id,
                status: "packed",
                ships_in_days: args.order_id % 3 + 1,
            })
        },
    );
    App::new().with_tool(lookup)
}
