//! Ready-made plugins for explicit completion: the model says when it is
//! done ([`TerminatePlugin`]) or produces declared results
//! ([`OutputsPlugin`]). Register them under an id of your choice and list
//! that id in `AgentSpec.plugin_ids`.

mod outputs;
mod terminate;

pub use outputs::{EmittedOutputs, JsonType, OutputsPlugin};
pub use terminate::TerminatePlugin;
