//! Typed tools, both forms: `tool_fn` (an async closure) and `TypedTool`
//! (a trait with a plain `async fn call`), registered with `with_tools`.
//!
//! Run it with `cargo run --example typed_tools`. It prints each tool's
//! generated schema, then a scripted run in which the model calls both
//! tools, once with arguments that do not fit (it gets an error result
//! naming the field and fixes its call).

use std::sync::Arc;

use rein::prelude::*;
use rein::schemars;
use rein::serde_json::json;

/// `add`'s arguments.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct AddArgs {
    a: f64,
    b: f64,
}

/// `convert`'s arguments: a nested struct, an enum and an optional field.
#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Convert {
    /// The amount to convert.
    amount: Amount,
    /// The unit to convert it to.
    to: Unit,
    /// Decimal places in the answer (default 2).
    precision: Option<u8>,
}

#[derive(serde::Deserialize, schemars::JsonSchema)]
struct Amount {
    value: f64,
    unit: Unit,
}

#[derive(Clone, Copy, serde::Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
enum Unit {
    Celsius,
    Fahrenheit,
}

/// `convert`'s output, shown to the model as JSON.
#[derive(serde::Serialize)]
struct Converted {
    value: String,
    unit: Unit,
}

/// A temperature converter, as a `TypedTool`.
struct Converter;

impl TypedTool for Converter {
    const NAME: &'static str = "convert";
    const DESCRIPTION: &'static str = "Converts a temperature between Celsius and Fahrenheit";
    type Args = Convert;
    type Output = Converted;

    async fn call(&self, args: Convert, _ctx: ToolContext) -> Result<Converted, ToolError> {
        let celsius = match args.amount.unit {
            Unit::Celsius => args.amount.value,
            Unit::Fahrenheit => (args.amount.value - 32.0) * 5.0 / 9.0,
        };
        let value = match args.to {
            Unit::Celsius => celsius,
            Unit::Fahrenheit => celsius * 9.0 / 5.0 + 32.0,
        };
        let places = usize::from(args.precision.unwrap_or(2));
        Ok(Converted {
            value: format!("{value:.places$}"),
            unit: args.to,
        })
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let add = tool_fn(
        "add",
        "Add two numbers",
        |args: AddArgs, _ctx: ToolContext| async move { Ok::<_, ToolError>(args.a + args.b) },
    );
    let convert = typed(Converter);
    for tool in [&add, &convert] {
        let descriptor = tool.descriptor();
        eprintln!("{} parameters: {}", descriptor.name, descriptor.parameters);
    }

    let model = ScriptedExecutor::new(vec![
        ScriptedResponse::tool_call("add", json!({ "a": "2", "b": 40 })),
        ScriptedResponse::tool_call("add", json!({ "a": 2, "b": 40 })),
        ScriptedResponse::tool_call(
            "convert",
            json!({ "amount": { "value": 42, "unit": "celsius" }, "to": "fahrenheit" }),
        ),
        ScriptedResponse::text("2 + 40 = 42, and 42 °C is 107.60 °F."),
    ]);
    let runtime = AgentRuntimeBuilder::new()
        .with_agent_spec(AgentSpec::new("calculator").with_model_id("scripted"))
        .with_model(ModelSpec::new("scripted", "offline", "typed-tools-script"))
        .with_provider("offline", Arc::new(model))
        .with_tools([add, convert])
        .build()?;
    let request = RunRequest::new(
        "typed",
        vec![Message::user("What is 2 + 40, in °F if it were °C?")],
    );
    let result = TerminalPrinter::new()
        .print_stream(runtime.run_stream(request))
        .await?;
    assert_eq!(result.termination, TerminationReason::NaturalEnd);
    Ok(())
}
