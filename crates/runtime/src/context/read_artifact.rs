//! The built-in `read_artifact` tool: the model reads back what the
//! context policy offloaded, whole or in part.

use std::sync::Arc;

use rein_runtime_contract::tool::{Tool, ToolContext, ToolDescriptor, ToolError, ToolOutput};
use serde::Deserialize;
use serde_json::json;

use super::ArtifactStore;

/// The tool's name.
pub const READ_ARTIFACT: &str = "read_artifact";

/// The most lines one call returns.
const MAX_LINES: usize = 400;
/// The most characters one call returns.
const MAX_CHARS: usize = 16_000;

/// `read_artifact`: an offloaded tool result of this thread, by id, with an
/// optional line range (1-based, inclusive) and a filter (`contains`, a
/// substring, or `regex`) keeping only matching lines. Lines come numbered;
/// a long answer is cut with a note saying where to go on.
pub struct ReadArtifact {
    store: Arc<dyn ArtifactStore>,
}

impl std::fmt::Debug for ReadArtifact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadArtifact").finish_non_exhaustive()
    }
}

impl ReadArtifact {
    /// The tool over `store`.
    pub fn new(store: Arc<dyn ArtifactStore>) -> Self {
        Self { store }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Args {
    id: String,
    #[serde(default)]
    start_line: Option<usize>,
    #[serde(default)]
    end_line: Option<usize>,
    #[serde(default)]
    contains: Option<String>,
    #[serde(default)]
    regex: Option<String>,
}

#[async_trait::async_trait]
impl Tool for ReadArtifact {
    fn descriptor(&self) -> ToolDescriptor {
        ToolDescriptor::new(
            READ_ARTIFACT,
            "Read a tool result that was offloaded from the conversation (its reference names \
             the id). Optionally give a line range and/or keep only lines containing a \
             substring or matching a regex.",
        )
        .with_parameters(json!({
            "type": "object",
            "properties": {
                "id": {"type": "string", "description": "The artifact id from the reference."},
                "start_line": {"type": "integer", "minimum": 1, "description": "First line (1-based)."},
                "end_line": {"type": "integer", "minimum": 1, "description": "Last line (inclusive)."},
                "contains": {"type": "string", "description": "Keep only lines containing this text."},
                "regex": {"type": "string", "description": "Keep only lines matching this regular expression."}
            },
            "required": ["id"]
        }))
    }

    async fn execute(
        &self,
        args: serde_json::Value,
        ctx: &ToolContext,
    ) -> Result<ToolOutput, ToolError> {
        let args: Args = serde_json::from_value(args).map_err(|e| {
            ToolError::new(format!(
                "bad arguments: {e}; expected {{\"id\": string, \"start_line\"?: integer, \"end_line\"?: integer, \"contains\"?: string, \"regex\"?: string}}"
            ))
        })?;
        let text = self
            .store
            .get(&ctx.thread_id, &args.id)
            .await
            .map_err(|e| ToolError::new(e.to_string()))?
            .ok_or_else(|| {
                ToolError::new(format!(
                    "no artifact \"{}\" in this thread; use the id given in the reference",
                    args.id
                ))
            })?;
        let regex = match &args.regex {
            Some(r) => Some(
                regex::Regex::new(r)
                    .map_err(|e| ToolError::new(format!("invalid regex \"{r}\": {e}")))?,
            ),
            None => None,
        };
        let total = text.lines().count();
        let start = args.start_line.unwrap_or(1).max(1);
        let end = args.end_line.unwrap_or(total).min(total);
        if start > end.max(1) && total > 0 {
            return Err(ToolError::new(format!(
                "start_line {start} is past end_line {end}; the artifact has {total} lines"
            )));
        }
        let mut out = String::new();
        let mut shown = 0;
        let mut cut_at = None;
        for (n, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l)) {
            if n < start || n > end {
                continue;
            }
            if args
                .contains
                .as_ref()
                .is_some_and(|c| !line.contains(c.as_str()))
                || regex.as_ref().is_some_and(|r| !r.is_match(line))
            {
                continue;
            }
            if shown == MAX_LINES || out.len() + line.len() > MAX_CHARS {
                cut_at = Some(n);
                break;
            }
            out.push_str(&format!("{n}: {line}\n"));
            shown += 1;
        }
        let mut header = format!("artifact \"{}\": {total} lines", args.id);
        if shown == 0 {
            header.push_str("; no line matched");
        }
        if let Some(n) = cut_at {
            out.push_str(&format!(
                "[cut: {shown} lines shown; call again with start_line {n} for more]\n"
            ));
        }
        Ok(ToolOutput::text(format!("{header}\n{out}")))
    }
}
