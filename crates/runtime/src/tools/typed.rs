//! [`TypedTool`]: a tool declared with Rust types, and [`typed`], which
//! makes it an `Arc<dyn Tool>`.

use std::sync::Arc;

use rein_runtime_contract::tool::{Tool, ToolContext, ToolDescriptor, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{args, parameters_schema};

/// A tool whose arguments and output are Rust types. Implement it with a
/// plain `async fn call`; register it with [`typed`].
///
/// ```
/// use rein_runtime::tools::{TypedTool, typed};
/// use rein_runtime_contract::tool::{ToolContext, ToolError};
///
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Lookup {
///     /// The city to look up.
///     city: String,
/// }
///
/// struct Weather;
///
/// impl TypedTool for Weather {
///     const NAME: &'static str = "weather";
///     const DESCRIPTION: &'static str = "Current weather of a city";
///     type Args = Lookup;
///     type Output = String;
///
///     async fn call(&self, args: Lookup, _ctx: ToolContext) -> Result<String, ToolError> {
///         Ok(format!("sunny in {}", args.city))
///     }
/// }
///
/// let tool = typed(Weather);
/// assert_eq!(tool.descriptor().name, "weather");
/// ```
pub trait TypedTool: Send + Sync + 'static {
    /// The name the model calls it by.
    const NAME: &'static str;
    /// What it does, for the model.
    const DESCRIPTION: &'static str;
    /// The arguments; their schema is generated (see
    /// [`parameters_schema`](super::parameters_schema)). Use a struct.
    type Args: DeserializeOwned + JsonSchema + Send;
    /// The output: a string is shown to the model as text, anything else as JSON.
    type Output: Serialize;

    /// Runs the tool. `ctx.cancellation` is cancelled with the run;
    /// honour it to stop promptly (the future is dropped at its next await
    /// otherwise).
    ///
    /// # Errors
    ///
    /// A [`ToolError`] the model sees as an error result; the run goes on.
    fn call(
        &self,
        args: Self::Args,
        ctx: ToolContext,
    ) -> impl Future<Output = Result<Self::Output, ToolError>> + Send;
}

/// Makes a [`TypedTool`] a [`Tool`]; its schema is generated once, here.
pub fn typed<T: TypedTool>(tool: T) -> Arc<dyn Tool> {
    let descriptor = ToolDescriptor::new(T::NAME, T::DESCRIPTION)
        .with_parameters(parameters_schema::<T::Args>());
    Arc::new(Typed { tool, descriptor })
}

struct Typed<T> {
    tool: T,
    descriptor: ToolDescriptor,
}

#[async_trait::async_trait]
impl<T: TypedTool> Tool for Typed<T> {
    fn descriptor(&self) -> ToolDescriptor {
        self.descriptor.clone()
    }

    async fn execute(
        &self,
        args: serde_json::Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        args::call_typed(T::NAME, args, |args: T::Args| {
            self.tool.call(args, ctx.clone())
        })
        .await
    }
}
