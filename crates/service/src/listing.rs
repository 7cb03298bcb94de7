//! Listing runs and threads: what an operator (or the console) sees of a
//! service without holding an id first.
//!
//! Both listings are **newest first** and paged by a [`Cursor`]: a page
//! ends with the cursor of its last item, and the next page starts after
//! it. Runs are ordered by when they were submitted, threads by when their
//! first run was (in distributed mode: when the thread was first stored);
//! both orders are fixed once an item exists, so paging never skips or
//! repeats an item, however many runs start meanwhile.
//!
//! In-process, the listings show the runs this process keeps (retention)
//! and the threads they ran on; in distributed mode they read the shared
//! database, whichever process ran the work.

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rein_runtime_contract::approval::rfc3339;
use rein_runtime_contract::message::TokenUsage;
use serde::{Deserialize, Serialize};

use crate::records::{RunEntry, RunStatus};

/// The most items one page holds.
pub const MAX_PAGE: usize = 500;

/// Which runs a listing shows; every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunFilter {
    /// Only runs in this status.
    pub status: Option<RunStatus>,
    /// Only runs of this agent.
    pub agent_id: Option<String>,
    /// Only finished runs that ended with this code (`natural_end`,
    /// `cancelled`, `error`, or a stop code such as `max_rounds`).
    pub termination: Option<String>,
    /// Only sub-agent runs of this run, or only top-level runs.
    pub parent: Option<Parent>,
    /// Only runs of this thread.
    pub thread_id: Option<String>,
    /// Only runs submitted at or after this instant.
    pub since: Option<SystemTime>,
    /// Only runs submitted before this instant.
    pub until: Option<SystemTime>,
    /// The page size (1 to [`MAX_PAGE`]; 0 means 50).
    pub limit: usize,
    /// Start after this item (the previous page's `next_cursor`).
    pub cursor: Option<Cursor>,
}

/// A listing's parent filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parent {
    /// Runs a tool call of this run started (its sub-agents' runs).
    Run(String),
    /// Runs no other run started.
    None,
}

/// Which threads a listing shows; every field that is set must match.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ThreadFilter {
    /// Only threads whose latest run is in this status.
    pub status: Option<RunStatus>,
    /// Only threads whose latest run is this agent's.
    pub agent_id: Option<String>,
    /// Only threads created at or after this instant.
    pub since: Option<SystemTime>,
    /// Only threads created before this instant.
    pub until: Option<SystemTime>,
    /// The page size (1 to [`MAX_PAGE`]; 0 means 50).
    pub limit: usize,
    /// Start after this item (the previous page's `next_cursor`).
    pub cursor: Option<Cursor>,
}

/// One run in a listing: what it is and how it ended, without its events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct RunSummary {
    /// The run.
    pub run_id: String,
    /// Its thread.
    pub thread_id: String,
    /// Its agent.
    pub agent_id: String,
    /// Where it is.
    pub status: RunStatus,
    /// How it ended: the termination's code (`natural_end`, `cancelled`,
    /// `error`, or the stop code).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub termination: Option<String>,
    /// For a sub-agent's run: the run whose tool call started it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent_run_id: Option<String>,
    /// When it was submitted (RFC 3339).
    pub created_at: String,
    /// When it finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<String>,
    /// Inferences made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    /// Token usage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<TokenUsage>,
}

/// One thread in a listing, with its latest run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct ThreadSummary {
    /// The thread.
    pub thread_id: String,
    /// When it was created (RFC 3339).
    pub created_at: String,
    /// How many runs of it are listed (in-process: kept).
    pub runs: u64,
    /// Its latest run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_run: Option<RunSummary>,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    /// The items, newest first.
    pub items: Vec<T>,
    /// Where the next page starts; `None` on the last page.
    pub next_cursor: Option<Cursor>,
}

/// A position in a listing: an item's time (microseconds since the Unix
/// epoch) and id. Its text form is opaque to clients.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Cursor {
    pub(crate) at_us: u64,
    pub(crate) id: String,
}

impl Cursor {
    pub(crate) fn new(at_us: u64, id: &str) -> Self {
        Self {
            at_us,
            id: id.to_owned(),
        }
    }

    /// The cursor a page's `next_cursor` text names.
    ///
    /// # Errors
    ///
    /// The text is not a cursor this service made; the message says so.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("`{text}` is not a cursor; pass a page's next_cursor unchanged");
        let (at, hex) = text.split_once('.').ok_or_else(bad)?;
        let at_us = at.parse().map_err(|_| bad())?;
        if hex.len() % 2 != 0 {
            return Err(bad());
        }
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(hex.get(i..i + 2).unwrap_or("zz"), 16))
            .collect::<Result<Vec<u8>, _>>()
            .map_err(|_| bad())?;
        let id = String::from_utf8(bytes).map_err(|_| bad())?;
        Ok(Self { at_us, id })
    }

    /// The item's time, in microseconds since the Unix epoch.
    pub fn at_us(&self) -> u64 {
        self.at_us
    }

    /// The item's id.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.", self.at_us)?;
        self.id.bytes().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

/// The page size a filter's `limit` asks for.
pub(crate) fn page_size(limit: usize) -> usize {
    match limit {
        0 => 50,
        n => n.min(MAX_PAGE),
    }
}

/// Now, in microseconds since the Unix epoch.
pub(crate) fn now_us() -> u64 {
    to_us(SystemTime::now())
}

/// `at` in microseconds since the Unix epoch (0 before it).
pub(crate) fn to_us(at: SystemTime) -> u64 {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
}

/// Microseconds since the Unix epoch as RFC 3339.
pub(crate) fn us_rfc3339(us: u64) -> String {
    rfc3339(UNIX_EPOCH + Duration::from_micros(us))
}

/// A page of kept runs (in-process listing).
pub(crate) fn runs_page(
    entries: Vec<std::sync::Arc<RunEntry>>,
    filter: &RunFilter,
) -> Page<RunSummary> {
    let since = filter.since.map(to_us);
    let until = filter.until.map(to_us);
    let mut found: Vec<(Cursor, RunSummary)> = entries
        .iter()
        .filter(|e| filter.thread_id.as_ref().is_none_or(|t| *t == e.thread_id))
        .filter(|e| filter.agent_id.as_ref().is_none_or(|a| *a == e.agent_id))
        .filter(|e| since.is_none_or(|s| e.created_us() >= s))
        .filter(|e| until.is_none_or(|u| e.created_us() < u))
        .map(|e| (Cursor::new(e.created_us(), &e.run_id), e))
        .filter(|(at, _)| filter.cursor.as_ref().is_none_or(|c| at < c))
        .map(|(at, e)| (at, e.listed()))
        .filter(|(_, r)| filter.status.is_none_or(|s| s == r.status))
        .filter(|(_, r)| {
            filter
                .termination
                .as_ref()
                .is_none_or(|t| r.termination.as_ref() == Some(t))
        })
        .filter(|(_, r)| match &filter.parent {
            None => true,
            Some(Parent::None) => r.parent_run_id.is_none(),
            Some(Parent::Run(p)) => r.parent_run_id.as_ref() == Some(p),
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    page(found, page_size(filter.limit))
}

/// A page of the threads of kept runs (in-process listing).
pub(crate) fn threads_page(
    entries: Vec<std::sync::Arc<RunEntry>>,
    filter: &ThreadFilter,
) -> Page<ThreadSummary> {
    let mut threads: std::collections::HashMap<&str, (u64, u64, &RunEntry)> =
        std::collections::HashMap::new();
    for entry in &entries {
        let at = entry.created_us();
        let thread = threads
            .entry(entry.thread_id.as_str())
            .or_insert((at, 0, entry));
        thread.0 = thread.0.min(at);
        thread.1 += 1;
        if (at, &entry.run_id) > (thread.2.created_us(), &thread.2.run_id) {
            thread.2 = entry;
        }
    }
    let since = filter.since.map(to_us);
    let until = filter.until.map(to_us);
    let mut found: Vec<(Cursor, ThreadSummary)> = threads
        .into_iter()
        .filter(|(_, (at, _, _))| since.is_none_or(|s| *at >= s) && until.is_none_or(|u| *at < u))
        .filter(|(_, (_, _, last))| filter.agent_id.as_ref().is_none_or(|a| *a == last.agent_id))
        .filter(|(_, (_, _, last))| filter.status.is_none_or(|s| s == last.status()))
        .map(|(id, (at, runs, last))| (Cursor::new(at, id), (id, at, runs, last)))
        .filter(|(at, _)| filter.cursor.as_ref().is_none_or(|c| at < c))
        .map(|(at, (id, created, runs, last))| {
            let summary = ThreadSummary {
                thread_id: id.to_owned(),
                created_at: us_rfc3339(created),
                runs,
                last_run: Some(last.listed()),
            };
            (at, summary)
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    page(found, page_size(filter.limit))
}

/// The first `size` of `found` (sorted), with the cursor of its last item
/// when more follow.
pub(crate) fn page<T>(mut found: Vec<(Cursor, T)>, size: usize) -> Page<T> {
    let more = found.len() > size;
    found.truncate(size);
    let next_cursor = if more {
        found.last().map(|(c, _)| c.clone())
    } else {
        None
    };
    Page {
        items: found.into_iter().map(|(_, item)| item).collect(),
        next_cursor,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_what_it_wrote_whatever_the_id_holds() {
        for id in ["run-1", "", "a.b.c", "ünïcode/€", "with space"] {
            let cursor = Cursor::new(1_764_000_000_123_456, id);
            assert_eq!(Cursor::parse(&cursor.to_string()), Ok(cursor));
        }
    }

    #[test]
    fn a_malformed_cursor_is_refused_with_its_text() {
        for text in ["", "12", "x.00", "12.0", "12.zz", "12.ff"] {
            let err = Cursor::parse(text).unwrap_err();
            assert!(err.contains(&format!("`{text}`")), "{err}");
        }
    }

    #[test]
    fn a_page_has_a_next_cursor_only_when_more_items_follow() {
        let items = |n: u64| (0..n).map(|i| (Cursor::new(100 - i, "r"), i)).collect();
        let full = page(items(3), 3);
        assert_eq!((full.items.len(), full.next_cursor), (3, None));
        let cut = page(items(4), 3);
        assert_eq!(cut.items, vec![0, 1, 2]);
        assert_eq!(cut.next_cursor, Some(Cursor::new(98, "r")));
    }
}
