//! The accept loop: which connections are served, for how long a client
//! may keep one without asking anything, and what is refused before
//! routing. It does not own the routes (see the parent module) nor who may
//! call (see `guard`).
//!
//! # The model
//!
//! Every connection is in one of three phases: **idle** (opened, or its
//! last answer sent, no byte of a next request yet), **head** (the first
//! byte of a request arrived, its head is not complete) or **busy** (a
//! request is being answered, from its head to the last byte of its
//! answer). A task per connection drives hyper's HTTP/1 connection and
//! watches the phase:
//!
//! - idle longer than `idle_timeout_ms`, or in the head longer than
//!   `header_timeout_ms`: the connection is closed (no answer; hyper's own
//!   header timer is not used, because it starts when a connection goes
//!   idle and so could not tell the two apart);
//! - busy: never cut, however long — an SSE stream or a `?wait=true`
//!   submission lasts as long as its run. Only the request's body has a
//!   bound: when it has not fully arrived `body_timeout_ms` after the head,
//!   reading it fails, the handler answers 408 `request_timeout`, and the
//!   connection closes.
//!
//! **The cap.** At most `max` connections are open (lowered to leave a
//! quarter of the file-descriptor limit, at least 32, for the rest of the
//! process). A connection accepted at the cap closes the one idle (or in
//! its head) the longest, so idle and half-sent sockets cannot lock out a
//! new client such as a health check; when every open connection is busy
//! the new one is closed at once. An accept that fails because the process
//! is out of file descriptors closes the longest-idle connection too, and
//! the loop backs off briefly instead of spinning; no accept error ends
//! the loop.
//!
//! **Before routing.** A request target (path and query) over
//! [`MAX_TARGET_BYTES`] gets the API's JSON 414 `uri_too_long`. hyper
//! itself still answers, with an empty body, a head it cannot parse (400),
//! a request target over 64 KiB (414) and a head over about 400 KiB (431).
//!
//! **Shutdown.** When the stop signal completes the listener closes, every
//! connection is asked to finish (hyper's graceful shutdown: an idle one
//! closes now, a busy one after its answer), and those still open after the
//! grace are dropped.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes, HttpBody};
use axum::http::{HeaderValue, Request, Response, header};
use axum::response::IntoResponse;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower_service::Service as _;

use super::ApiError;
use crate::deployment::ConnectionSettings;

/// The longest request target (path and query, or an absolute URI) that is
/// routed: 8 KiB. Longer ones get 414 `uri_too_long`.
pub(crate) const MAX_TARGET_BYTES: usize = 8 * 1024;

/// How often, at most, a refused connection or a failing accept is logged.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The file descriptors kept for the rest of the process when the cap is
/// lowered: a quarter of the limit, at least this many.
const MIN_RESERVED_FDS: u64 = 32;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The limits in force, from `server.connections`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    max: usize,
    idle: Duration,
    header: Duration,
    body: Duration,
}

impl Limits {
    /// The limits of `settings`, the cap lowered to fit the process's
    /// file-descriptor limit (logged when it is).
    pub(crate) fn new(settings: &ConnectionSettings) -> Self {
        let ms = |v: u64| Duration::from_millis(v.max(1));
        let configured = usize::try_from(settings.max.max(1)).unwrap_or(usize::MAX);
        let max = match fd_limit() {
            Some(limit) => {
                let room = limit
                    .saturating_sub((limit / 4).max(MIN_RESERVED_FDS))
                    .max(1);
                let room = usize::try_from(room).unwrap_or(usize::MAX);
                if room < configured {
                    tracing::info!(
                        "server.connections.max {configured} lowered to {room}: the process may open {limit} files"
                    );
                }
                configured.min(room)
            }
            None => configured,
        };
        Self {
            max,
            idle: ms(settings.idle_timeout_ms),
            header: ms(settings.header_timeout_ms),
            body: ms(settings.body_timeout_ms),
        }
    }
}

/// The soft limit on open files (`RLIMIT_NOFILE`).
#[cfg(unix)]
#[allow(clippy::useless_conversion)] // `rlim_t` is not `u64` everywhere.
fn fd_limit() -> Option<u64> {
    use nix::sys::resource::{Resource, getrlimit};
    getrlimit(Resource::RLIMIT_NOFILE)
        .ok()
        .map(|(soft, _)| u64::from(soft))
}

#[cfg(not(unix))]
fn fd_limit() -> Option<u64> {
    None
}

/// Serves `router` on `listener` under `limits` until `stop` completes;
/// then closes the listener, asks every connection to finish, and drops
/// those still open after `grace`.
///
/// # Errors
///
/// None today: every accept error is logged and retried (after a brief
/// back-off when the process is out of file descriptors).
///
/// # Cancel safety
///
/// Dropping the future closes the listener and drops every open
/// connection at once (their requests' futures are dropped, as when the
/// client goes away); `stop` is dropped with it.
pub(crate) async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
    grace: Duration,
) -> std::io::Result<()> {
    let open = Registry::default();
    let tracker = TaskTracker::new();
    // Cancelled to drop every connection: after the grace, or when this
    // future is dropped.
    let kill = CancellationToken::new();
    let _kill_on_drop = kill.clone().drop_guard();
    let draining = CancellationToken::new();
    let mut warned: Option<Instant> = None;
    let mut warn_due = move || {
        let due = warned.is_none_or(|at| at.elapsed() >= WARN_EVERY);
        if due {
            warned = Some(Instant::now());
        }
        due
    };
    let mut stop = pin!(stop);
    loop {
        let accepted = tokio::select! {
            () = &mut stop => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                // No Nagle delay: SSE events and small answers go out at once.
                let _ = stream.set_nodelay(true);
                match open.admit(limits.max, kill.child_token()) {
                    Some((id, conn)) => {
                        tracker.spawn(connection(
                            stream,
                            id,
                            conn,
                            router.clone(),
                            limits,
                            draining.clone(),
                            open.clone(),
                        ));
                    }
                    None => {
                        if warn_due() {
                            tracing::warn!(
                                "refusing connections: all {} allowed (server.connections.max) are answering requests",
                                limits.max
                            );
                        }
                        drop(stream);
                    }
                }
            }
            Err(e) if per_connection(&e) => {}
            Err(e) => {
                let freed = out_of_fds(&e) && open.evict_longest_idle();
                if warn_due() {
                    tracing::warn!("accept error: {e}; backing off");
                }
                let pause = if freed { 10 } else { 100 };
                tokio::time::sleep(Duration::from_millis(pause)).await;
            }
        }
    }
    drop(listener);
    draining.cancel();
    tracker.close();
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        kill.cancel();
        tracker.wait().await;
    }
    Ok(())
}

/// An accept error about one connection (it went away before it was
/// accepted): the next accept may succeed at once.
fn per_connection(e: &std::io::Error) -> bool {
    use std::io::ErrorKind as K;
    matches!(
        e.kind(),
        K::ConnectionAborted | K::ConnectionReset | K::ConnectionRefused | K::Interrupted
    )
}

/// The process (or the system) has no file descriptor left.
#[cfg(unix)]
fn out_of_fds(e: &std::io::Error) -> bool {
    use nix::errno::Errno;
    e.raw_os_error()
        .is_some_and(|code| code == Errno::EMFILE as i32 || code == Errno::ENFILE as i32)
}

#[cfg(not(unix))]
fn out_of_fds(_: &std::io::Error) -> bool {
    false
}

/// One connection, from accept to close.
#[allow(clippy::too_many_arguments)]
async fn connection(
    stream: TcpStream,
    id: u64,
    conn: Arc<Conn>,
    router: Router,
    limits: Limits,
    draining: CancellationToken,
    open: Registry,
) {
    let _registered = Registered { open, id };
    let io = TokioIo::new(Watched {
        io: stream,
        conn: conn.clone(),
    });
    let service = {
        let conn = conn.clone();
        hyper::service::service_fn(move |req| handle(req, router.clone(), conn.clone(), limits))
    };
    let mut serving =
        pin!(hyper::server::conn::http1::Builder::new().serve_connection(io, service));
    let mut finishing = false;
    loop {
        let deadline = conn.deadline(&limits);
        tokio::select! {
            result = serving.as_mut() => {
                if let Err(e) = result {
                    tracing::debug!("connection ended: {e}");
                }
                break;
            }
            // Evicted at the cap, or dropped after the shutdown's grace.
            () = conn.evict.cancelled() => break,
            () = draining.cancelled(), if !finishing => {
                finishing = true;
                serving.as_mut().graceful_shutdown();
            }
            // The phase changed: compute the deadline again. A change made
            // before this wait began left a permit, so none is missed.
            () = conn.changed.notified() => {}
            () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {
                if conn.deadline(&limits).is_some_and(|d| d <= Instant::now()) {
                    tracing::debug!("closing a connection past its idle or header timeout");
                    break;
                }
            }
        }
    }
}

/// One request: refused here when its target is too long, otherwise routed
/// with its body under the body deadline. The connection is busy until the
/// answer's last byte is handed to hyper.
async fn handle(
    req: Request<Incoming>,
    mut router: Router,
    conn: Arc<Conn>,
    limits: Limits,
) -> Result<Response<Tracked>, Infallible> {
    let busy = Busy::enter(conn.clone());
    let uri = req.uri();
    let target = uri.path_and_query().map_or(0, |p| p.as_str().len())
        + uri.authority().map_or(0, |a| a.as_str().len());
    let mut response = if target > MAX_TARGET_BYTES {
        ApiError::new(
            414,
            "uri_too_long",
            format!(
                "the request target is {target} bytes, over the limit of {MAX_TARGET_BYTES}; send long data in a body"
            ),
        )
        .into_response()
    } else {
        let req = req.map(|body| {
            if body.is_end_stream() {
                Body::new(body)
            } else {
                Body::new(Deadline {
                    body,
                    sleep: Box::pin(tokio::time::sleep(limits.body)),
                    conn: conn.clone(),
                })
            }
        });
        // A router is always ready; asked anyway, as tower's contract says.
        let Ok(()) = std::future::poll_fn(|cx| {
            <Router as tower_service::Service<Request<Body>>>::poll_ready(&mut router, cx)
        })
        .await;
        let Ok(response) = router.call(req).await;
        response
    };
    if conn.body_timed_out.swap(false, Ordering::Relaxed) {
        // The rest of the body is still on its way: do not read it as the
        // next request.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    Ok(response.map(|body| Tracked { body, _busy: busy }))
}

/// A request body that did not fully arrive within
/// `server.connections.body_timeout_ms`; the extractors answer it with 408
/// `request_timeout`.
#[derive(Debug, thiserror::Error)]
#[error(
    "the request body did not arrive within server.connections.body_timeout_ms; send it at once"
)]
pub(crate) struct BodyTimedOut;

/// A request body that fails with [`BodyTimedOut`] once its deadline has
/// passed.
struct Deadline {
    body: Incoming,
    sleep: Pin<Box<Sleep>>,
    conn: Arc<Conn>,
}

impl HttpBody for Deadline {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => match this.sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.conn.body_timed_out.store(true, Ordering::Relaxed);
                    Poll::Ready(Some(Err(Box::new(BodyTimedOut))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// An answer's body; the connection stays busy until hyper drops it (its
/// last byte handed over, or the connection gone).
struct Tracked {
    body: Body,
    _busy: Busy,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Where a connection is (see the module's model).
#[derive(Debug, Clone, Copy)]
enum Phase {
    /// Since when no byte of a next request has arrived.
    Idle(Instant),
    /// Since when a request's head has been arriving.
    Head(Instant),
    /// How many requests are being answered (one, with HTTP/1).
    Busy(usize),
}

/// What the accept loop, the connection's task, its socket and its
/// requests share about one connection.
#[derive(Debug)]
struct Conn {
    phase: Mutex<Phase>,
    /// Notified when the phase leaves busy or a head starts, so the task
    /// computes its deadline again.
    changed: Notify,
    /// Cancelled to close the connection at once.
    evict: CancellationToken,
    /// Set when the body deadline passed; the answer closes the connection.
    body_timed_out: AtomicBool,
}

impl Conn {
    fn new(evict: CancellationToken) -> Self {
        Self {
            phase: Mutex::new(Phase::Idle(Instant::now())),
            changed: Notify::new(),
            evict,
            body_timed_out: AtomicBool::new(false),
        }
    }

    fn phase(&self) -> MutexGuard<'_, Phase> {
        // The phase is a plain value, whole after any panic.
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes came in: an idle connection starts a head.
    fn bytes_arrived(&self) {
        let mut phase = self.phase();
        if let Phase::Idle(_) = *phase {
            *phase = Phase::Head(Instant::now());
            drop(phase);
            self.changed.notify_one();
        }
    }

    /// When the connection times out in its phase (never while busy).
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        match *self.phase() {
            Phase::Idle(since) => Some(since + limits.idle),
            Phase::Head(since) => Some(since + limits.header),
            Phase::Busy(_) => None,
        }
    }

    /// Since when it has been waiting for a request; `None` while busy.
    fn waiting_since(&self) -> Option<Instant> {
        match *self.phase() {
            Phase::Idle(since) | Phase::Head(since) => Some(since),
            Phase::Busy(_) => None,
        }
    }
}

/// A request being answered on a connection: busy from `enter` until drop.
struct Busy(Arc<Conn>);

impl Busy {
    fn enter(conn: Arc<Conn>) -> Self {
        {
            let mut phase = conn.phase();
            *phase = match *phase {
                Phase::Busy(n) => Phase::Busy(n + 1),
                Phase::Idle(_) | Phase::Head(_) => Phase::Busy(1),
            };
        }
        Self(conn)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut phase = self.0.phase();
        match *phase {
            Phase::Busy(n) if n > 1 => *phase = Phase::Busy(n - 1),
            _ => {
                *phase = Phase::Idle(Instant::now());
                drop(phase);
                self.0.changed.notify_one();
            }
        }
    }
}

/// A socket that tells its connection when bytes arrive.
struct Watched {
    io: TcpStream,
    conn: Arc<Conn>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.io).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.conn.bytes_arrived();
        }
        polled
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The open connections, for the cap.
#[derive(Debug, Clone, Default)]
struct Registry(Arc<Mutex<Open>>);

#[derive(Debug, Default)]
struct Open {
    next_id: u64,
    /// Open connections that are not being evicted.
    live: usize,
    /// Every connection whose task runs, with whether it is being evicted.
    conns: HashMap<u64, (Arc<Conn>, bool)>,
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Open> {
        // Counts and a map, consistent after every statement.
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a new connection, first evicting the longest-waiting one
    /// at the cap; `None` when at the cap every connection is busy.
    fn admit(&self, max: usize, evict: CancellationToken) -> Option<(u64, Arc<Conn>)> {
        let mut open = self.lock();
        if open.live >= max && !evict_longest_idle(&mut open) {
            return None;
        }
        let id = open.next_id;
        open.next_id += 1;
        open.live += 1;
        let conn = Arc::new(Conn::new(evict));
        open.conns.insert(id, (conn.clone(), false));
        Some((id, conn))
    }

    /// Closes the connection waiting the longest for a request; false when
    /// there is none.
    fn evict_longest_idle(&self) -> bool {
        evict_longest_idle(&mut self.lock())
    }
}

fn evict_longest_idle(open: &mut Open) -> bool {
    let longest = open
        .conns
        .iter()
        .filter(|(_, (_, evicted))| !evicted)
        .filter_map(|(id, (conn, _))| conn.waiting_since().map(|since| (since, *id)))
        .min();
    let Some((_, id)) = longest else {
        return false;
    };
    if let Some((conn, evicted)) = open.conns.get_mut(&id) {
        *evicted = true;
        conn.evict.cancel();
    }
    open.live -= 1;
    true
}

/// Removes its connection from the registry when the task ends.
struct Registered {
    open: Registry,
    id: u64,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let mut open = self.open.lock();
        if let Some((_, evicted)) = open.conns.remove(&self.id)
            && !evicted
        {
            open.live -= 1;
        }
    }
}
