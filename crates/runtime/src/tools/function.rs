//! [`tool_fn`]: a tool from a name, a description and an async closure.

use std::marker::PhantomData;
use std::sync::Arc;

use rein_runtime_contract::tool::{Tool, ToolContext, ToolDescriptor, ToolError, ToolOutput};
use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{args, parameters_schema};

/// A tool from an async function of typed arguments: the arguments' schema
/// is generated from `A` (see [`parameters_schema`]), arguments that do not
/// fit become an errored result naming the field, and the output is any
/// `Serialize` value (a string is text, anything else JSON).
///
/// ```
/// use rein_runtime::tools::tool_fn;
/// use rein_runtime_contract::tool::{ToolContext, ToolError};
///
/// #[derive(serde::Deserialize, schemars::JsonSchema)]
/// struct Shout { text: String }
///
/// let shout = tool_fn("shout", "Upper-cases text", |args: Shout, _ctx: ToolContext| async move {
///     Ok::<_, ToolError>(args.text.to_uppercase())
/// });
/// assert_eq!(shout.descriptor().parameters["properties"]["text"]["type"], "string");
/// ```
///
/// `A` must be `'static` (an owned type, as every `DeserializeOwned`
/// struct is): the tool is type-erased behind `Arc<dyn Tool>`.
pub fn tool_fn<A, O, F, Fut>(name: &str, description: &str, f: F) -> Arc<dyn Tool>
where
    A: DeserializeOwned + JsonSchema + Send + 'static,
    O: Serialize,
    F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, ToolError>> + Send,
{
    let descriptor =
        ToolDescriptor::new(name, description).with_parameters(parameters_schema::<A>());
    Arc::new(FnTool {
        handler: f,
        descriptor,
        args: PhantomData,
    })
}

/// The closure, seen through a trait whose future is an associated type:
/// its lifetime then follows from the closure's and the arguments' types,
/// so no `'static` bound on the future is needed.
trait Handler<A>: Send + Sync + 'static {
    type Output: Serialize;
    type Future: Future<Output = Result<Self::Output, ToolError>> + Send;
    fn call(&self, args: A, ctx: ToolContext) -> Self::Future;
}

impl<A, O, F, Fut> Handler<A> for F
where
    O: Serialize,
    F: Fn(A, ToolContext) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<O, ToolError>> + Send,
{
    type Output = O;
    type Future = Fut;
    fn call(&self, args: A, ctx: ToolContext) -> Fut {
        self(args, ctx)
    }
}

struct FnTool<H, A> {
    handler: H,
    descriptor: ToolDescriptor,
    args: PhantomData<fn(A)>,
}

#[async_trait::async_trait]
impl<H, A> Tool for FnTool<H, A>
where
    H: Handler<A>,
    A: DeserializeOwned + Send + 'static,
{
    fn descriptor(&self) -> ToolDescriptor {
        self.descriptor.clone()
    }

    async fn execute(
        &self,
        args: serde_json::Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        args::call_typed(&self.descriptor.name, args, |args: A| {
            self.handler.call(args, ctx.clone())
        })
        .await
    }
}
