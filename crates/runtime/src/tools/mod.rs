//! Typed tools: a tool's arguments as a Rust type, its schema generated.
//!
//! A [`Tool`](rein_runtime_contract::tool::Tool) sees its arguments as a
//! `serde_json::Value` and describes them with a hand-written JSON schema.
//! This module builds that tool from Rust types instead:
//!
//! - [`tool_fn`] turns a name, a description and an async closure taking
//!   typed arguments into an `Arc<dyn Tool>`;
//! - [`TypedTool`] is the trait form, turned into one by [`typed`].
//!
//! Either way the parameters schema is generated from the argument type by
//! `schemars` ([`parameters_schema`]) in the form providers accept: an
//! object schema, nested types inlined, no `$schema` key. Arguments that do
//! not fit the type become an errored tool result that tells the model the
//! field and what was expected — the run goes on. The output is any
//! `Serialize` value: a string is shown to the model as text, anything
//! else as JSON.
//!
//! ```
//! use rein_runtime::tools::tool_fn;
//! use rein_runtime_contract::tool::{ToolContext, ToolError};
//!
//! #[derive(serde::Deserialize, schemars::JsonSchema)]
//! struct AddArgs { a: f64, b: f64 }
//!
//! let add = tool_fn("add", "Add two numbers", |args: AddArgs, _ctx: ToolContext| async move {
//!     Ok::<_, ToolError>(args.a + args.b)
//! });
//! assert_eq!(add.descriptor().name, "add");
//! assert_eq!(add.descriptor().parameters["required"], serde_json::json!(["a", "b"]));
//! ```

mod args;
mod function;
mod schema;
mod typed;

pub use function::tool_fn;
pub use schema::parameters_schema;
pub use typed::{TypedTool, typed};
