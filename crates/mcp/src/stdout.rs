//! A stdio server's stdout as Rein reads it: line by line, with two
//! duties the SDK's transport does not have.
//!
//! - **End of stream.** When stdout ends (the server exited) or fails,
//!   `closed` is cancelled, so calls in flight end at once instead of when
//!   the SDK notices.
//! - **Oversized lines.** One JSON-RPC message is one line. A line longer
//!   than the limit is never held whole: Rein keeps its first and last few
//!   hundred bytes and counts the rest. When it ends, a response is
//!   replaced by an error response with the same id, which Rein's call
//!   reads as "result too large (N bytes)" — at once, not after the tool
//!   timeout. (The SDK's own line limit drops such a line silently, and
//!   the call then waits out its whole timeout.) Other oversized messages
//!   are dropped with a warning.
//!
//! Memory is bounded by the limit plus one read buffer, whatever the
//! server writes.

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, ReadBuf};
use tokio_util::sync::CancellationToken;

/// The JSON-RPC error code of a substituted response (in the range
/// JSON-RPC leaves to implementations).
pub(crate) const TOO_LARGE_CODE: i32 = -32_099;

/// How much of an oversized line's start and end is kept to find its id.
const KEPT: usize = 512;

/// How much is read from the child at once.
const CHUNK: usize = 64 * 1024;

/// A stdio server's stdout, framed (see the [module docs](self)).
pub(crate) struct Stdout<R> {
    inner: R,
    closed: CancellationToken,
    server: String,
    limit: usize,
    /// The current line while it is within the limit.
    line: Vec<u8>,
    /// The current line once it went over the limit.
    over: Option<Oversized>,
    /// Whole lines ready for the reader, from `at` on.
    ready: Vec<u8>,
    at: usize,
    chunk: Box<[u8]>,
    ended: bool,
}

/// What is kept of an oversized line: its first and last `KEPT` bytes,
/// and its length.
#[derive(Default)]
struct Oversized {
    head: Vec<u8>,
    tail: Vec<u8>,
    len: usize,
}

impl Oversized {
    fn push(&mut self, bytes: &[u8]) {
        let room = KEPT - self.head.len();
        self.head.extend_from_slice(&bytes[..bytes.len().min(room)]);
        self.len += bytes.len();
        self.tail
            .extend_from_slice(&bytes[bytes.len().saturating_sub(KEPT)..]);
        if self.tail.len() > KEPT {
            self.tail.drain(..self.tail.len() - KEPT);
        }
    }
}

impl<R> Stdout<R> {
    pub(crate) fn new(inner: R, closed: CancellationToken, server: &str, limit: usize) -> Self {
        Self {
            inner,
            closed,
            server: server.to_owned(),
            limit,
            line: Vec::new(),
            over: None,
            ready: Vec::new(),
            at: 0,
            chunk: vec![0; CHUNK].into_boxed_slice(),
            ended: false,
        }
    }

    /// Takes bytes read from the child, moving every line they end to
    /// `ready`.
    fn take(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            let (part, ends) = match bytes.iter().position(|&b| b == b'\n') {
                Some(i) => (&bytes[..i], true),
                None => (bytes, false),
            };
            bytes = &bytes[part.len() + usize::from(ends)..];
            if let Some(over) = &mut self.over {
                over.push(part);
            } else if self.line.len() + part.len() > self.limit {
                let mut over = Oversized::default();
                over.push(&std::mem::take(&mut self.line));
                over.push(part);
                self.over = Some(over);
            } else {
                self.line.extend_from_slice(part);
            }
            if ends {
                self.end_line();
            }
        }
    }

    fn end_line(&mut self) {
        if let Some(over) = self.over.take() {
            match substitute(&over, self.limit) {
                Some(answer) => {
                    tracing::warn!(server = %self.server, bytes = over.len, limit = self.limit,
                        "MCP server sent a result over the limit; the call is answered with an error");
                    self.ready.extend_from_slice(answer.as_bytes());
                    self.ready.push(b'\n');
                }
                None => tracing::warn!(server = %self.server, bytes = over.len, limit = self.limit,
                    "MCP server sent a message over the limit that answers no call; dropped"),
            }
        } else if self.ready.len() == self.at {
            self.ready.clear();
            self.at = 0;
            std::mem::swap(&mut self.ready, &mut self.line);
            self.ready.push(b'\n');
        } else {
            self.ready.extend_from_slice(&self.line);
            self.ready.push(b'\n');
            self.line.clear();
        }
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Stdout<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            if this.at < this.ready.len() {
                let n = buf.remaining().min(this.ready.len() - this.at);
                buf.put_slice(&this.ready[this.at..this.at + n]);
                this.at += n;
                if this.at == this.ready.len() {
                    this.ready.clear();
                    this.at = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.ended {
                this.closed.cancel();
                return Poll::Ready(Ok(()));
            }
            let mut chunk = ReadBuf::new(&mut this.chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut chunk) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    this.closed.cancel();
                    return Poll::Ready(Err(e));
                }
                Poll::Ready(Ok(())) => {
                    let n = chunk.filled().len();
                    if n == 0 {
                        // A last line without its newline still goes to
                        // the SDK, which reads it at end of stream.
                        this.ended = true;
                        if this.over.is_none() && !this.line.is_empty() {
                            let line = std::mem::take(&mut this.line);
                            this.ready.extend_from_slice(&line);
                        }
                        continue;
                    }
                    let chunk = std::mem::take(&mut this.chunk);
                    this.take(&chunk[..n]);
                    this.chunk = chunk;
                }
            }
        }
    }
}

/// The error response that replaces an oversized response, or `None` when
/// the line is no response (no `result`/`error` key near its start) or
/// its id cannot be found.
fn substitute(over: &Oversized, limit: usize) -> Option<String> {
    let head = String::from_utf8_lossy(&over.head);
    let answer_at = ["\"result\"", "\"error\""]
        .iter()
        .filter_map(|k| head.find(k))
        .min()?;
    // The id precedes the result (`{"jsonrpc":"2.0","id":1,"result":…}`)
    // or ends the message (`{"result":…,"jsonrpc":"2.0","id":1}`).
    let id = match head[..answer_at].find("\"id\"") {
        Some(at) => id_value(&head[at + 4..]),
        None => {
            let tail = String::from_utf8_lossy(&over.tail);
            let at = tail.rfind("\"id\"")?;
            id_value(&tail[at + 4..])
        }
    }?;
    Some(
        serde_json::json!({
            "jsonrpc": "2.0",
            "id": id,
            "error": {
                "code": TOO_LARGE_CODE,
                "message": format!("result too large ({} bytes; the limit is {limit} bytes)", over.len),
                "data": {"bytes": over.len, "limit": limit},
            }
        })
        .to_string(),
    )
}

/// The JSON value after `"id"` in `rest` (`: 7`, `:"a"`): a number or a
/// string.
fn id_value(rest: &str) -> Option<serde_json::Value> {
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let end = if let Some(s) = rest.strip_prefix('"') {
        1 + s.find('"')? + 1
    } else {
        rest.find(|c: char| !(c.is_ascii_digit() || c == '-'))
            .unwrap_or(rest.len())
    };
    serde_json::from_str(&rest[..end]).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    async fn read_all(input: Vec<u8>, limit: usize) -> (String, bool) {
        let closed = CancellationToken::new();
        let mut out = Stdout::new(&input[..], closed.clone(), "s", limit);
        let mut text = String::new();
        out.read_to_string(&mut text).await.unwrap();
        (text, closed.is_cancelled())
    }

    #[tokio::test]
    async fn lines_within_the_limit_pass_unchanged_and_the_end_is_signalled() {
        let input = b"{\"a\":1}\n{\"b\":2}\n{\"c\":3}".to_vec();
        let (text, closed) = read_all(input, 64).await;
        assert_eq!(text, "{\"a\":1}\n{\"b\":2}\n{\"c\":3}");
        assert!(closed);
    }

    #[tokio::test]
    async fn an_oversized_response_with_its_id_last_becomes_an_error_with_that_id() {
        let big = "x".repeat(300_000);
        let line = format!(
            "{{\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"{big}\"}}]}},\"jsonrpc\":\"2.0\",\"id\":7}}\n{{\"after\":1}}\n"
        );
        let len = line.find('\n').unwrap();
        let (text, _) = read_all(line.into_bytes(), 1000).await;
        let mut lines = text.lines();
        let error: serde_json::Value = serde_json::from_str(lines.next().unwrap()).unwrap();
        assert_eq!(error["id"], 7);
        assert_eq!(error["error"]["code"], TOO_LARGE_CODE);
        assert_eq!(error["error"]["data"]["bytes"], len);
        assert_eq!(lines.next(), Some("{\"after\":1}"));
    }

    #[tokio::test]
    async fn an_oversized_response_with_its_id_first_keeps_a_string_id() {
        let big = "y".repeat(5000);
        let line = format!("{{\"jsonrpc\":\"2.0\",\"id\":\"r-1\",\"result\":\"{big}\"}}\n");
        let (text, _) = read_all(line.into_bytes(), 100).await;
        let error: serde_json::Value = serde_json::from_str(text.trim_end()).unwrap();
        assert_eq!(error["id"], "r-1");
    }

    #[tokio::test]
    async fn an_oversized_notification_is_dropped() {
        let big = "z".repeat(5000);
        let input = format!(
            "{{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":\"{big}\"}}\n{{\"ok\":1}}\n"
        );
        let (text, _) = read_all(input.into_bytes(), 100).await;
        assert_eq!(text, "{\"ok\":1}\n");
    }
}
