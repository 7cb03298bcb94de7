//! Ready-made plugins for explicit completion: the model says when it is
//! done ([`TerminatePlugin`]), produces declared results
//! ([`OutputsPlugin`]), or works through a plan until no step is active
//! ([`PlanPlugin`]). Register them under an id of your choice and list
//! that id in `AgentSpec.plugin_ids`.

mod outputs;
mod plan;
mod terminate;

pub use outputs::{EmittedOutputs, JsonType, OutputsPlugin};
pub use plan::{FINALIZE_PROMPT, PLAN_TOOL, Plan, PlanKey, PlanPlugin, PlanStep, StepStatus};
pub use terminate::TerminatePlugin;
