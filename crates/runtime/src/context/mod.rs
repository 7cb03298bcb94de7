//! Context engineering: what the model sees of a thread, kept inside its
//! window (the agent's [`ContextPolicy`]).
//!
//! # Two views of one history
//!
//! The **stored history** (the run's `request.messages`, what the
//! `ThreadStore` keeps and hooks see) always holds every message in full.
//! With a policy that offloads, compacts or summarizes, a run also keeps a
//! **model view** — its own `InferenceRequest`, built from the history as it
//! grows — and sends that instead:
//!
//! 1. a tool result over `offload.min_tokens` enters the view as a reference
//!    (artifact id, size, preview) and its text goes to the [`ArtifactStore`];
//! 2. over `compact.at` of the usable window, every tool result before the
//!    last `keep_last_rounds` rounds becomes a reference, all in one go;
//! 3. still over `summarize.at`, the rounds before the last
//!    `keep_last_rounds` are replaced by one summary message.
//!
//! Nothing ever removes a tool call or separates it from its result, the
//! system prompt and the tool list are never touched, and older messages
//! change only in those batches, so the prefix a provider caches stays the
//! same between them.
//!
//! Before each inference the prompt's tokens are estimated ([`tokens`]);
//! a `token_budget` refuses the call that would exceed what remains.
//!
//! **Invariant:** without a context policy and without a `token_budget`, a
//! run has no `ContextWindow` and sends its history as before.

pub mod artifacts;
mod read_artifact;
pub mod tokens;

pub use artifacts::{ArtifactError, ArtifactStore, DirArtifactStore, InMemoryArtifactStore};
pub use read_artifact::{READ_ARTIFACT, ReadArtifact};
#[cfg(feature = "tiktoken")]
pub use tokens::TiktokenCounter;
pub use tokens::{Calibration, TokenCounter};

use std::sync::Arc;

use rein_runtime_contract::context::ContextPolicy;
use rein_runtime_contract::inference::{InferenceRequest, LlmExecutor};
use rein_runtime_contract::message::{Message, Role};
use rein_runtime_contract::spec::ModelSpec;

/// What an agent's runs share for context management (built by the
/// builder when the agent has a context policy or a token budget).
pub(crate) struct ContextSetup {
    pub(crate) policy: Option<ContextPolicy>,
    pub(crate) artifacts: Arc<dyn ArtifactStore>,
    pub(crate) calibration: Arc<Calibration>,
    /// The smallest `token_budget`'s `max_total`, if any.
    pub(crate) budget: Option<u64>,
    /// Output tokens kept free: the policy's reserve or the model's
    /// `max_output_tokens`, whichever is larger.
    pub(crate) reserve: u64,
    /// The model and executor that write summaries.
    pub(crate) summarizer: Option<(ModelSpec, Arc<dyn LlmExecutor>)>,
    /// The compact forms of calls, by tool name: the argument keys an old
    /// call keeps (the tools' own, then the policy's `compact.calls`).
    pub(crate) compact_calls: std::collections::HashMap<String, Vec<String>>,
    /// Each thread's view as its last run left it: the next run goes on
    /// from it instead of offloading, compacting and summarizing the
    /// whole history again.
    pub(crate) views: std::sync::Mutex<std::collections::HashMap<String, SavedView>>,
}

impl ContextSetup {
    /// Forgets the thread's saved view (the thread was deleted).
    pub(crate) fn forget(&self, thread_id: &str) {
        self.views
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(thread_id);
    }
}

/// The most threads whose views an agent keeps between runs; past it, a
/// thread's next run rebuilds its view from the history.
const MAX_SAVED_VIEWS: usize = 1024;

/// A view a run left for the thread's next run.
pub(crate) struct SavedView {
    messages: Arc<Vec<Message>>,
    meta: Vec<Meta>,
    synced: usize,
    chars: u64,
    reads: std::collections::HashSet<String>,
    /// The last history message the view reflects, to recognise the
    /// history it was made from.
    last: Option<Message>,
}

impl std::fmt::Debug for ContextSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextSetup")
            .field("policy", &self.policy)
            .field("budget", &self.budget)
            .field("reserve", &self.reserve)
            .finish_non_exhaustive()
    }
}

/// Per view message: its size, whether compaction is done with it (a
/// result that is a reference, calls in their compact form, or nothing
/// smaller to make of it), and where it is in the history (`None`: a
/// summary, which is not).
#[derive(Debug, Clone, Copy)]
struct Meta {
    chars: u64,
    reference: bool,
    origin: Option<usize>,
}

/// A compaction or summary that changed the view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) before: u64,
    pub(crate) after: u64,
    /// Tool results turned into references, or messages summarized.
    pub(crate) count: u32,
}

/// The first line of the message a summary replaces rounds with.
const SUMMARY_HEADER: &str =
    "[Summary of the earlier conversation, written to save space; the full history is kept]";

/// The rounds a summary is to replace.
pub(crate) struct SummaryPlan {
    /// View messages `..boundary` are summarized.
    pub(crate) boundary: usize,
    /// Them, as a transcript.
    pub(crate) transcript: String,
}

/// One run's context state. See the [module docs](self).
pub(crate) struct ContextWindow {
    pub(crate) setup: Arc<ContextSetup>,
    thread_id: String,
    /// The model view, when the policy transforms the history.
    view: Option<InferenceRequest>,
    meta: Vec<Meta>,
    /// History messages reflected so far.
    synced: usize,
    /// Characters and messages of what the model sees, without `fixed`.
    chars: u64,
    /// The system prompt's and tool list's characters.
    fixed: u64,
    /// What the last prompt sent measured (for calibration).
    sent: (u64, u64),
    /// Calls of `read_artifact` seen: their results are never offloaded
    /// as they arrive (the model asked for that text).
    reads: std::collections::HashSet<String>,
    /// The view the thread's last run left, taken up at the first sync
    /// (when the run's history is loaded).
    saved: Option<SavedView>,
    /// The run's token budget: the smaller of the agent's and the
    /// request's.
    pub(crate) budget: Option<u64>,
}

impl ContextWindow {
    pub(crate) fn new(
        setup: Arc<ContextSetup>,
        thread_id: &str,
        request: &InferenceRequest,
    ) -> Self {
        let transforms = setup
            .policy
            .as_ref()
            .is_some_and(|p| p.uses_artifacts() || p.summarize.is_some());
        let view = transforms.then(|| {
            let mut view = request.clone();
            view.messages = Arc::new(Vec::new());
            view
        });
        let setup_budget = setup.budget;
        let mut window = Self {
            fixed: setup
                .calibration
                .fixed_size(request.system.as_deref(), &request.tools),
            setup,
            thread_id: thread_id.to_owned(),
            view,
            meta: Vec::new(),
            synced: 0,
            chars: 0,
            sent: (0, 0),
            reads: std::collections::HashSet::new(),
            saved: None,
            budget: setup_budget,
        };
        if window.view.is_some() {
            window.saved = window
                .setup
                .views
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .remove(thread_id);
        }
        window
    }

    /// Lowers the run's token budget to `budget` (a request's own).
    pub(crate) fn limit_budget(&mut self, budget: Option<u64>) {
        if let Some(budget) = budget {
            self.budget = Some(self.budget.map_or(budget, |b| b.min(budget)));
        }
    }

    /// Takes up the view the thread's last run left, if it was made from
    /// this history (the history then extends what it reflects).
    fn resume(&mut self, saved: SavedView, history: &[Message]) {
        let Some(view) = &mut self.view else {
            return;
        };
        let same = saved.synced <= history.len()
            && saved.synced > 0
            && history.get(saved.synced - 1) == saved.last.as_ref();
        if !same {
            return;
        }
        view.messages = saved.messages;
        self.meta = saved.meta;
        self.synced = saved.synced;
        self.chars = saved.chars;
        self.reads = saved.reads;
    }

    /// Leaves the view for the thread's next run (see [`ContextSetup::views`]).
    pub(crate) fn save(self, history: &[Message]) {
        let Some(view) = self.view else {
            return;
        };
        let saved = if let Some(untouched) = self.saved {
            // The run ended before its first inference: the last view stands.
            untouched
        } else if self.synced == 0 || self.synced > history.len() {
            return;
        } else {
            SavedView {
                messages: view.messages,
                meta: self.meta,
                synced: self.synced,
                chars: self.chars,
                reads: self.reads,
                last: history.get(self.synced - 1).cloned(),
            }
        };
        let mut views = self
            .setup
            .views
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if views.len() >= MAX_SAVED_VIEWS && !views.contains_key(&self.thread_id) {
            // Full: one other thread starts over from its history next time.
            let evicted = views.keys().next().cloned();
            if let Some(evicted) = evicted {
                views.remove(&evicted);
            }
        }
        views.insert(self.thread_id, saved);
    }

    /// Brings the counts up to `history` when the window has no view (no
    /// policy: only a token budget reads its estimate), where nothing is
    /// offloaded or compacted and so nothing awaits. `false`, with nothing
    /// done, when it has a view: [`sync`](Self::sync) it instead.
    pub(crate) fn count_new(&mut self, history: &[Message]) -> bool {
        if self.view.is_some() || self.saved.is_some() || self.setup.policy.is_some() {
            return false;
        }
        if self.synced > history.len() {
            // The history was replaced under the run: count it again.
            self.synced = 0;
            self.chars = 0;
        }
        let calibration = &self.setup.calibration;
        let new = &history[self.synced..];
        self.chars += new.iter().map(|m| calibration.message_size(m)).sum::<u64>();
        self.synced = history.len();
        true
    }

    /// Brings the view up to `history` (appended to since the last call):
    /// new messages join it, large tool results as references.
    pub(crate) async fn sync(&mut self, request: &InferenceRequest) {
        let history = &request.messages;
        if let Some(saved) = self.saved.take() {
            self.resume(saved, history);
        }
        if self.synced > history.len() {
            // The history was replaced under the run (never by the loop):
            // start over.
            self.synced = 0;
            self.chars = 0;
            self.meta.clear();
            if let Some(view) = &mut self.view {
                view.messages = Arc::new(Vec::new());
            }
        }
        let first = self.synced;
        let new = &history[self.synced..];
        self.synced = history.len();
        let Some(view) = &mut self.view else {
            let calibration = &self.setup.calibration;
            self.chars += new.iter().map(|m| calibration.message_size(m)).sum::<u64>();
            return;
        };
        view.tool_choice.clone_from(&request.tool_choice);
        let offload = self
            .setup
            .policy
            .as_ref()
            .and_then(|p| p.offload.as_ref())
            .map(|o| o.min_tokens);
        let calibration = &self.setup.calibration;
        let mut added = Vec::with_capacity(new.len());
        for (origin, message) in (first..).zip(new) {
            let mut message = message.clone();
            let mut reference = false;
            self.reads.extend(
                message
                    .tool_calls
                    .iter()
                    .filter(|c| c.name == READ_ARTIFACT)
                    .map(|c| c.id.clone()),
            );
            let read = message
                .tool_call_id
                .as_ref()
                .is_some_and(|id| self.reads.contains(id));
            if let Some(min) = offload
                && message.role == Role::Tool
                && !read
                && calibration.tokens(calibration.size(&message.content), 0) >= min
                && let Some(text) = offload_one(
                    &*self.setup.artifacts,
                    &self.thread_id,
                    &message,
                    calibration,
                )
                .await
            {
                message.content = text;
                reference = true;
            }
            let chars = calibration.message_size(&message);
            self.chars += chars;
            self.meta.push(Meta {
                chars,
                reference,
                origin: Some(origin),
            });
            added.push(message);
        }
        Arc::make_mut(&mut view.messages).extend(added);
    }

    /// The request to send: the view, or the history itself.
    /// Sends the view's next requests to `model` (a fallback).
    pub(crate) fn route_to(&mut self, model: &rein_runtime_contract::spec::ModelSpec) {
        if let Some(view) = &mut self.view {
            view.model.clone_from(&model.upstream_model);
            view.temperature = model.temperature;
            view.max_output_tokens = model.max_output_tokens;
        }
    }

    pub(crate) fn request<'a>(&'a self, history: &'a InferenceRequest) -> &'a InferenceRequest {
        self.view.as_ref().unwrap_or(history)
    }

    fn messages(&self) -> u64 {
        self.synced_len() as u64
    }

    fn synced_len(&self) -> usize {
        match &self.view {
            Some(view) => view.messages.len(),
            None => self.synced,
        }
    }

    /// The estimated tokens of the prompt as it would be sent now.
    pub(crate) fn estimate(&self) -> u64 {
        self.setup
            .calibration
            .tokens(self.chars + self.fixed, self.messages())
    }

    /// The estimate with the history's messages not yet synced into the
    /// view counted as they are (offloading may shrink them at the sync).
    pub(crate) fn estimate_with(&self, history: &[Message]) -> u64 {
        let calibration = &self.setup.calibration;
        let pending = history.get(self.synced..).unwrap_or_default();
        let size: u64 = pending.iter().map(|m| calibration.message_size(m)).sum();
        calibration.tokens(
            self.chars + self.fixed + size,
            self.messages() + pending.len() as u64,
        )
    }

    /// Notes what is being sent (for calibration by its usage).
    pub(crate) fn sending(&mut self) {
        self.sent = (self.chars + self.fixed, self.messages());
    }

    /// Learns from the input tokens the provider reported for the prompt
    /// last sent.
    pub(crate) fn observe(&self, input_tokens: u64) {
        let (chars, messages) = self.sent;
        self.setup
            .calibration
            .observe(chars, messages, input_tokens);
    }

    /// The policy's window, if the agent has a policy.
    pub(crate) fn window_tokens(&self) -> Option<u64> {
        self.setup.policy.as_ref().map(|p| p.window_tokens)
    }

    fn usable(&self) -> Option<u64> {
        self.setup.policy.as_ref().map(ContextPolicy::usable_tokens)
    }

    /// Whether the estimate is over `at` of the usable window.
    fn over(&self, at: f64) -> bool {
        self.usable()
            .is_some_and(|usable| self.estimate() as f64 > at * usable as f64)
    }

    /// Whether compaction is due (over `compact.at`).
    pub(crate) fn compaction_due(&self) -> bool {
        let at = self
            .setup
            .policy
            .as_ref()
            .and_then(|p| p.compact.as_ref())
            .map(|c| c.at);
        at.is_some_and(|at| self.over(at))
    }

    /// Whether a summary is due (over `summarize.at`).
    pub(crate) fn summary_due(&self) -> bool {
        let at = self
            .setup
            .policy
            .as_ref()
            .and_then(|p| p.summarize.as_ref())
            .map(|s| s.at);
        at.is_some_and(|at| self.over(at))
    }

    /// The configured `compact.keep_last_rounds`.
    pub(crate) fn compact_keep(&self) -> Option<usize> {
        self.setup
            .policy
            .as_ref()
            .and_then(|p| p.compact.as_ref())
            .map(|c| c.keep_last_rounds)
    }

    /// The configured `summarize.keep_last_rounds`.
    pub(crate) fn summary_keep(&self) -> Option<usize> {
        self.setup
            .policy
            .as_ref()
            .and_then(|p| p.summarize.as_ref())
            .map(|s| s.keep_last_rounds)
    }

    /// Where the last `keep` rounds begin in the view: the index of the
    /// `keep`-th assistant message from the end (0 if there are fewer).
    fn kept_from(&self, keep: usize) -> usize {
        let Some(view) = &self.view else {
            return 0;
        };
        if keep == 0 {
            return view.messages.len();
        }
        let mut seen = 0;
        for (i, m) in view.messages.iter().enumerate().rev() {
            if m.role == Role::Assistant {
                seen += 1;
                if seen == keep {
                    return i;
                }
            }
        }
        0
    }

    /// The compaction step's share of what can be compacted
    /// (`compact.fraction`; 1 without a compact policy).
    pub(crate) fn compact_fraction(&self) -> f64 {
        self.setup
            .policy
            .as_ref()
            .and_then(|p| p.compact.as_ref())
            .map_or(1.0, |c| c.fraction)
    }

    /// One compaction step: of what can be compacted before the last
    /// `keep` rounds — tool results not yet references, and calls of tools
    /// with a compact form — the oldest `fraction` (at least one) is
    /// turned into references; `None` if nothing changed.
    pub(crate) async fn compact(&mut self, keep: usize, fraction: f64) -> Option<Change> {
        let boundary = self.kept_from(keep);
        let before = self.estimate();
        let calibration = self.setup.calibration.clone();
        let setup = self.setup.clone();
        let view = self.view.as_mut()?;
        let candidates: Vec<usize> = (0..boundary)
            .filter(|&i| {
                let message = &view.messages[i];
                !self.meta[i].reference
                    && (message.role == Role::Tool
                        || message
                            .tool_calls
                            .iter()
                            .any(|c| setup.compact_calls.contains_key(&c.name)))
            })
            .collect();
        if candidates.is_empty() {
            return None;
        }
        let take =
            ((candidates.len() as f64 * fraction).ceil() as usize).clamp(1, candidates.len());
        let mut count = 0u32;
        let mut replaced: Vec<(usize, Option<Message>)> = Vec::new();
        // A step turns its share, and goes on past what could not be made
        // smaller (a short result), so that a step changes something
        // whenever anything still can.
        for (n, &i) in candidates.iter().enumerate() {
            if n >= take && replaced.iter().any(|(_, c)| c.is_some()) {
                break;
            }
            let message = &view.messages[i];
            let compacted = if message.role == Role::Tool {
                offload_one(&*setup.artifacts, &self.thread_id, message, &calibration)
                    .await
                    .filter(|text| text.len() < message.content.len())
                    .map(|text| {
                        let mut message = message.clone();
                        message.content = text;
                        message
                    })
            } else {
                compact_calls(&setup, &self.thread_id, message, &calibration).await
            };
            replaced.push((i, compacted));
        }
        let messages = Arc::make_mut(&mut view.messages);
        for (i, compacted) in replaced {
            // Done with it either way: what could not be made smaller is
            // not tried again.
            self.meta[i].reference = true;
            let Some(compacted) = compacted else {
                continue;
            };
            messages[i] = compacted;
            let chars = self.setup.calibration.message_size(&messages[i]);
            self.chars = self.chars - self.meta[i].chars + chars;
            self.meta[i].chars = chars;
            count += 1;
        }
        (count > 0).then(|| Change {
            before,
            after: self.estimate(),
            count,
        })
    }

    /// The rounds before the last `keep` as a transcript to summarize;
    /// `None` when there are none (or no view).
    ///
    /// The transcript is made from the full data, never from the view's
    /// references: each message as the `history` holds it (an earlier
    /// summary as it stands). At most half the usable window of the oldest
    /// messages, measured in full, is taken, so the summarizing call fits
    /// its window however long the history is; one message larger than a
    /// quarter of that is cut, with a note naming where the rest is. A
    /// history longer than that is summarized in passes, each folding the
    /// summary before it (the first message) into the next.
    pub(crate) fn summary_plan(&self, keep: usize, history: &[Message]) -> Option<SummaryPlan> {
        let view = self.view.as_ref()?;
        let max_tokens = self.usable().map_or(u64::MAX, |usable| usable / 2);
        let kept = self.kept_from(keep);
        let calibration = &self.setup.calibration;
        // The most characters one message brings to the transcript.
        let per_message = if max_tokens == u64::MAX {
            usize::MAX
        } else {
            (max_tokens as f64 / 4.0 * calibration.chars_per_token()) as usize
        };
        let full = |i: usize| -> std::borrow::Cow<'_, Message> {
            match self.meta[i].origin.and_then(|o| history.get(o)) {
                Some(original) if self.meta[i].reference => std::borrow::Cow::Owned(
                    cut_for_summary(original, &view.messages[i], per_message),
                ),
                Some(original) => std::borrow::Cow::Borrowed(original),
                None => std::borrow::Cow::Borrowed(&view.messages[i]),
            }
        };
        let mut boundary = 0;
        let mut units = 0;
        while boundary < kept {
            units += calibration.message_size(&full(boundary));
            if boundary >= 2 && calibration.tokens(units, boundary as u64 + 1) > max_tokens {
                break;
            }
            boundary += 1;
        }
        // Never cut between a call and its results.
        while boundary > 0
            && boundary < view.messages.len()
            && view.messages[boundary].role == Role::Tool
        {
            boundary -= 1;
        }
        // Something to summarize besides an earlier summary.
        let only_summary = boundary == 1 && view.messages[0].content.starts_with(SUMMARY_HEADER);
        if boundary == 0 || only_summary {
            return None;
        }
        let messages: Vec<Message> = (0..boundary).map(|i| full(i).into_owned()).collect();
        let transcript = crate::history::transcript(&messages, None);
        Some(SummaryPlan {
            boundary,
            transcript,
        })
    }

    /// Replaces the view's messages before `plan.boundary` by `summary`.
    pub(crate) fn apply_summary(&mut self, plan: &SummaryPlan, summary: &str) -> Option<Change> {
        let before = self.estimate();
        let view = self.view.as_mut()?;
        let message = Message::user(format!("{SUMMARY_HEADER}\n{summary}"));
        let chars = self.setup.calibration.message_size(&message);
        let messages = Arc::make_mut(&mut view.messages);
        messages.splice(..plan.boundary, [message]);
        let removed: u64 = self.meta[..plan.boundary].iter().map(|m| m.chars).sum();
        self.meta.splice(
            ..plan.boundary,
            [Meta {
                chars,
                reference: false,
                origin: None,
            }],
        );
        self.chars = self.chars - removed + chars;
        Some(Change {
            before,
            after: self.estimate(),
            count: u32::try_from(plan.boundary).unwrap_or(u32::MAX),
        })
    }
}

/// `message` (an assistant message) with its calls of tools that have a
/// compact form in that form: the kept arguments, and a reference to the
/// whole arguments, stored as the artifact `<call id>.arguments`; `None`
/// when no call changed (none has a form, drops anything, gets shorter, or
/// the store failed — logged).
async fn compact_calls(
    setup: &ContextSetup,
    thread_id: &str,
    message: &Message,
    calibration: &Calibration,
) -> Option<Message> {
    let mut compacted = message.clone();
    let mut changed = false;
    for call in &mut compacted.tool_calls {
        let Some(keep) = setup.compact_calls.get(&call.name) else {
            continue;
        };
        let serde_json::Value::Object(arguments) = &call.arguments else {
            continue;
        };
        let dropped: Vec<&str> = arguments
            .keys()
            .filter(|k| !keep.contains(k))
            .map(String::as_str)
            .collect();
        if dropped.is_empty() {
            continue;
        }
        let text = call.arguments.to_string();
        let name = format!("{}.arguments", call.id);
        let id = match artifact_id(&*setup.artifacts, thread_id, &name, &text).await {
            Ok((id, true)) => id,
            Ok((id, false)) => match setup.artifacts.put(thread_id, &id, &text).await {
                Ok(()) => id,
                Err(error) => {
                    tracing::warn!(%error, thread_id, id, "could not compact a call's arguments; they stay in the prompt");
                    continue;
                }
            },
            Err(error) => {
                tracing::warn!(%error, thread_id, "could not compact a call's arguments; they stay in the prompt");
                continue;
            }
        };
        let tokens = calibration.tokens(calibration.size(&text), 0);
        let mut kept = serde_json::Map::new();
        for key in keep {
            if let Some(value) = arguments.get(key) {
                kept.insert(key.clone(), value.clone());
            }
        }
        kept.insert(
            COMPACTED_KEY.to_owned(),
            serde_json::Value::String(format!(
                "[arguments {} offloaded to artifact \"{id}\" with the call's whole arguments, about {tokens} tokens; call {READ_ARTIFACT} with id \"{id}\" to read them]",
                dropped.join(", ")
            )),
        );
        let shorter = serde_json::Value::Object(kept);
        if shorter.to_string().len() < text.len() {
            call.arguments = shorter;
            changed = true;
        }
    }
    changed.then_some(compacted)
}

/// The key that holds, in a compacted call's arguments, the reference to
/// the whole arguments.
pub const COMPACTED_KEY: &str = "_compacted";

/// `original` (a message the view holds as `reference`) for a summary's
/// transcript: whole, or cut to `max_chars` characters with a note that
/// the reference says where the rest is.
fn cut_for_summary(original: &Message, reference: &Message, max_chars: usize) -> Message {
    let mut message = original.clone();
    if message.content.len() > max_chars {
        let mut cut = max_chars;
        while !message.content.is_char_boundary(cut) {
            cut -= 1;
        }
        message.content.truncate(cut);
        if reference.content == original.content {
            message.content.push_str("\n[… cut for the summary]");
        } else {
            message.content.push_str(&format!(
                "\n[… cut for the summary; the whole text: {}]",
                reference.content
            ));
        }
    }
    message
}

/// The most texts one hashed artifact id is tried for (a hash collision
/// of different texts); past it the result stays in the prompt.
const MAX_ID_REUSE: usize = 16;

/// FNV-1a, 64 bits: a hash of an artifact's text that stays the same
/// across builds and releases (ids are stored in histories' views).
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The artifact id for a result of call `call_id`: the call id itself,
/// unless the thread already has a different text under it (a provider
/// that reuses or leaves out call ids), then `call_id~<hash of the text>`
/// (and only if that is taken by yet another text, `call_id~<hash>~2`, …)
/// — so an earlier reference never reads a later result, and finding an
/// id takes two reads however often the call id was reused. The same text
/// under the same id (offloaded again by a later run) keeps its id; the
/// flag says it is stored already.
async fn artifact_id(
    store: &dyn ArtifactStore,
    thread_id: &str,
    call_id: &str,
    text: &str,
) -> Result<(String, bool), ArtifactError> {
    if !call_id.is_empty() {
        match store.get(thread_id, call_id).await? {
            Some(stored) if stored != text => {}
            stored => return Ok((call_id.to_owned(), stored.is_some())),
        }
    }
    let base = format!(
        "{}~{:016x}",
        if call_id.is_empty() { "call" } else { call_id },
        fnv1a(text)
    );
    for n in 1..=MAX_ID_REUSE {
        let id = if n == 1 {
            base.clone()
        } else {
            format!("{base}~{n}")
        };
        match store.get(thread_id, &id).await? {
            Some(stored) if stored != text => {}
            stored => return Ok((id, stored.is_some())),
        }
    }
    Err(ArtifactError(format!(
        "call id \"{call_id}\": {MAX_ID_REUSE} different results of thread \"{thread_id}\" share one hash; the result stays in the prompt"
    )))
}

/// Stores `message`'s text as an artifact named by its call id and returns
/// the reference that replaces it; `None` if it could not be stored (the
/// full text then stays in view).
async fn offload_one(
    store: &dyn ArtifactStore,
    thread_id: &str,
    message: &Message,
    calibration: &Calibration,
) -> Option<String> {
    let call_id = message.tool_call_id.as_deref()?;
    let (id, stored) = match artifact_id(store, thread_id, call_id, &message.content).await {
        Ok(found) => found,
        Err(error) => {
            tracing::warn!(%error, thread_id, call_id, "could not offload a tool result; it stays in the prompt");
            return None;
        }
    };
    if !stored && let Err(error) = store.put(thread_id, &id, &message.content).await {
        tracing::warn!(%error, thread_id, id, "could not offload a tool result; it stays in the prompt");
        return None;
    }
    let text = &message.content;
    let lines = text.lines().count();
    let tokens = calibration.tokens(calibration.size(text), 0);
    let mut preview: String = text.lines().take(5).collect::<Vec<_>>().join("\n");
    if preview.len() > 300 {
        let mut cut = 300;
        while !preview.is_char_boundary(cut) {
            cut -= 1;
        }
        preview.truncate(cut);
    }
    Some(format!(
        "[tool result offloaded to artifact \"{id}\": {lines} lines, about {tokens} tokens. \
         Preview:\n{preview}\n… call {READ_ARTIFACT} with id \"{id}\" (optionally start_line/\
         end_line, or contains/regex to filter lines) to read it]"
    ))
}
