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
//! hyper lets go of an answer once its end is buffered, not sent, so the
//! socket is watched too: while a write waits for the client to read, no
//! timer runs (and the connection is not evicted), and idle starts again
//! from the write that sent the rest. Bytes of a next request that arrive
//! while busy, after the request's body, make the connection leave busy in
//! the head rather than idle (approximately: such bytes read together with
//! the end of a body are not noticed).
//!
//! **The cap.** At most `max` connections are open (lowered to leave a
//! quarter of the file-descriptor limit, at least 32, for the rest of the
//! process). A connection accepted at the cap closes the one idle (or in
//! its head) the longest, so idle and half-sent sockets cannot lock out a
//! new client such as a health check; when every open connection is busy
//! the new one is closed at once. Which one is evicted is decided under the
//! lock a request takes to become busy: a connection that started a request
//! is never evicted, and a head completed on an evicted connection gets 503
//! `connection_evicted` (if it gets out before the close), never routed.
//! An accept that fails because the process is out of file descriptors
//! closes the longest-idle connection too, and the loop backs off briefly
//! instead of spinning; no accept error ends the loop.
//!
//! **Before routing.** A request target (path and query, with the
//! authority of an absolute-form target) over [`MAX_TARGET_BYTES`] gets
//! the API's JSON 414 `uri_too_long`. hyper itself still answers, with an
//! empty body, a head it cannot parse (400), a request target over 64 KiB
//! (414) and a head over [`MAX_BUF_BYTES`], 80 KiB (431).
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
use hyper::body::{Frame, SizeHint};
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

/// The longest request target that is routed: 8 KiB, counting its path and
/// query and, for an absolute-form target, its authority (not the scheme).
/// Longer ones get 414 `uri_too_long`.
pub(crate) const MAX_TARGET_BYTES: usize = 8 * 1024;

/// The most a connection buffers, read or write: a request head over it
/// gets hyper's 431. Above hyper's 64 KiB target limit, so a target over
/// that still gets its 414.
const MAX_BUF_BYTES: usize = 80 * 1024;

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
    let mut serving = pin!(
        hyper::server::conn::http1::Builder::new()
            .max_buf_size(MAX_BUF_BYTES)
            .serve_connection(io, service)
    );
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
            // Evicted at the cap (only while idle or in a head), or dropped
            // after the shutdown's grace.
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

/// One request: refused here when its connection was evicted or its target
/// is too long, otherwise routed with its body under the body deadline.
/// The connection is busy until the answer's last byte is handed to hyper
/// (and not timed until it is sent, see `Watched`).
async fn handle<B>(
    req: Request<B>,
    mut router: Router,
    conn: Arc<Conn>,
    limits: Limits,
) -> Result<Response<Tracked>, Infallible>
where
    B: HttpBody<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    let Some(busy) = Busy::enter(conn.clone()) else {
        // Evicted at the cap before this request's head was complete: the
        // connection is closing, and the request was not run, so the
        // client may send it again.
        let mut response = ApiError::new(
            503,
            "connection_evicted",
            "this connection was closed to make room for another (server.connections.max) before the request started; it was not run, send it again",
        )
        .into_response();
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        return Ok(response.map(|body| Tracked { body, _busy: None }));
    };
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
                conn.body_done();
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
    Ok(response.map(|body| Tracked {
        body,
        _busy: Some(busy),
    }))
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
/// passed, and tells its connection when it has all been read.
struct Deadline<B> {
    body: B,
    sleep: Pin<Box<Sleep>>,
    conn: Arc<Conn>,
}

impl<B> HttpBody for Deadline<B>
where
    B: HttpBody<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => {
                if frame.is_none() || this.body.is_end_stream() {
                    this.conn.body_done();
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
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
/// last byte handed over, or the connection gone). No `Busy` for the 503
/// of an evicted connection.
struct Tracked {
    body: Body,
    _busy: Option<Busy>,
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
    /// Closed at the cap while idle or in a head (decided under the lock,
    /// so never once a request started): a request whose head completes
    /// anyway is answered 503 `connection_evicted`, never routed.
    Evicted,
}

/// A connection's phase and what moves it, under one lock.
#[derive(Debug)]
struct State {
    phase: Phase,
    /// The request being answered has no body, or all of it has been read:
    /// bytes arriving now belong to the next request.
    body_done: bool,
    /// Bytes of a next request arrived while busy (after the body): the
    /// connection leaves busy in the head, not idle.
    pipelined: bool,
    /// A write is waiting for the client to read: an answer (or its end)
    /// is still being sent, whatever the phase. No timer runs and the
    /// connection is not evicted until a write makes progress.
    write_blocked: bool,
}

/// What the accept loop, the connection's task, its socket and its
/// requests share about one connection.
#[derive(Debug)]
struct Conn {
    state: Mutex<State>,
    /// Notified when the phase leaves busy, a head starts or a blocked write
    /// makes progress, so the task computes its deadline again.
    changed: Notify,
    /// Cancelled to close the connection at once.
    evict: CancellationToken,
    /// Set when the body deadline passed; the answer closes the connection.
    body_timed_out: AtomicBool,
}

impl Conn {
    fn new(evict: CancellationToken) -> Self {
        Self {
            state: Mutex::new(State {
                phase: Phase::Idle(Instant::now()),
                body_done: false,
                pipelined: false,
                write_blocked: false,
            }),
            changed: Notify::new(),
            evict,
            body_timed_out: AtomicBool::new(false),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Plain values, whole after any panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes came in: an idle connection starts a head; a busy one whose
    /// request body is done has the start of a next request (pipelined).
    /// Approximate: bytes of a next head read together with the end of a
    /// body, or before the handler saw that end, are not noticed, and that
    /// head is timed as idle once the answer is done.
    fn bytes_arrived(&self) {
        let mut state = self.state();
        match state.phase {
            Phase::Idle(_) => {
                state.phase = Phase::Head(Instant::now());
                drop(state);
                self.changed.notify_one();
            }
            Phase::Busy(_) if state.body_done => state.pipelined = true,
            Phase::Busy(_) | Phase::Head(_) | Phase::Evicted => {}
        }
    }

    /// The request's body has all been read.
    fn body_done(&self) {
        self.state().body_done = true;
    }

    /// A write (or flush) is waiting for the client to read.
    fn write_blocked(&self) {
        self.state().write_blocked = true;
    }

    /// A write made progress: a blocked connection is unblocked, and an
    /// idle one is idle from now (its answer's end only just went out).
    fn write_progressed(&self) {
        let mut state = self.state();
        if state.write_blocked {
            state.write_blocked = false;
            if let Phase::Idle(_) = state.phase {
                state.phase = Phase::Idle(Instant::now());
            }
            drop(state);
            self.changed.notify_one();
        }
    }

    /// When the connection times out in its phase (never while busy or
    /// while a write waits for the client).
    fn deadline(&self, limits: &Limits) -> Option<Instant> {
        let state = self.state();
        if state.write_blocked {
            return None;
        }
        match state.phase {
            Phase::Idle(since) => Some(since + limits.idle),
            Phase::Head(since) => Some(since + limits.header),
            Phase::Busy(_) | Phase::Evicted => None,
        }
    }

    /// Since when it has been waiting for a request; `None` while busy,
    /// while a write waits for the client, or once evicted.
    fn waiting_since(&self) -> Option<Instant> {
        let state = self.state();
        if state.write_blocked {
            return None;
        }
        match state.phase {
            Phase::Idle(since) | Phase::Head(since) => Some(since),
            Phase::Busy(_) | Phase::Evicted => None,
        }
    }

    /// Evicts the connection if it is still waiting for a request: marks
    /// it evicted and closes it, deciding under the lock `Busy::enter`
    /// takes, so a request that started is never dropped. False when it
    /// is busy (or sending) by now.
    fn try_evict(&self) -> bool {
        let mut state = self.state();
        if state.write_blocked {
            return false;
        }
        match state.phase {
            Phase::Idle(_) | Phase::Head(_) => {
                state.phase = Phase::Evicted;
                drop(state);
                self.evict.cancel();
                true
            }
            Phase::Busy(_) | Phase::Evicted => false,
        }
    }
}

/// A request being answered on a connection: busy from `enter` until drop.
struct Busy(Arc<Conn>);

impl Busy {
    /// The connection starts answering a request; `None` when it was
    /// evicted (the request must not be routed).
    fn enter(conn: Arc<Conn>) -> Option<Self> {
        {
            let mut state = conn.state();
            state.phase = match state.phase {
                Phase::Evicted => return None,
                Phase::Busy(n) => Phase::Busy(n + 1),
                Phase::Idle(_) | Phase::Head(_) => {
                    state.body_done = false;
                    state.pipelined = false;
                    Phase::Busy(1)
                }
            };
        }
        Some(Self(conn))
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let mut state = self.0.state();
        match state.phase {
            Phase::Busy(n) if n > 1 => state.phase = Phase::Busy(n - 1),
            Phase::Evicted => {}
            Phase::Busy(_) | Phase::Idle(_) | Phase::Head(_) => {
                // Bytes of a next request came while busy: its head is
                // timed from now, as if it had started now.
                state.phase = if std::mem::take(&mut state.pipelined) {
                    Phase::Head(Instant::now())
                } else {
                    Phase::Idle(Instant::now())
                };
                drop(state);
                self.0.changed.notify_one();
            }
        }
    }
}

/// A socket that tells its connection when bytes arrive, and when a write
/// waits for the client to read or makes progress again: hyper drops an
/// answer's body once its last frame is buffered, not sent, so the idle
/// timer must not run while the rest is still going out.
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

impl Watched {
    /// Tells the connection how a write went.
    fn wrote(&self, polled: &Poll<std::io::Result<usize>>) {
        match polled {
            Poll::Pending => self.conn.write_blocked(),
            Poll::Ready(Ok(n)) if *n > 0 => self.conn.write_progressed(),
            Poll::Ready(_) => {}
        }
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.wrote(&polled);
        polled
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.wrote(&polled);
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        match polled {
            Poll::Pending => this.conn.write_blocked(),
            Poll::Ready(Ok(())) => this.conn.write_progressed(),
            Poll::Ready(Err(_)) => {}
        }
        polled
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

/// Evicts the connection waiting the longest for a request. Each one is
/// decided under its own lock (see `Conn::try_evict`): one that started a
/// request since it was listed is skipped for the next.
fn evict_longest_idle(open: &mut Open) -> bool {
    let mut waiting: Vec<(Instant, u64)> = open
        .conns
        .iter()
        .filter(|(_, (_, evicted))| !evicted)
        .filter_map(|(id, (conn, _))| conn.waiting_since().map(|since| (since, *id)))
        .collect();
    waiting.sort_unstable();
    for (_, id) in waiting {
        if let Some((conn, evicted)) = open.conns.get_mut(&id)
            && conn.try_evict()
        {
            *evicted = true;
            open.live -= 1;
            return true;
        }
    }
    false
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

#[cfg(test)]
mod tests {
    use super::*;

    use axum::routing::get;
    use std::sync::atomic::AtomicUsize;

    fn limits() -> Limits {
        Limits {
            max: 2,
            idle: Duration::from_secs(60),
            header: Duration::from_secs(10),
            body: Duration::from_secs(30),
        }
    }

    #[tokio::test]
    async fn a_request_on_an_evicted_connection_gets_503_and_is_not_routed() {
        let routed = Arc::new(AtomicUsize::new(0));
        let router = Router::new().route(
            "/",
            get({
                let routed = routed.clone();
                move || async move {
                    routed.fetch_add(1, Ordering::Relaxed);
                    "routed"
                }
            }),
        );
        let open = Registry::default();
        let (_, conn) = open.admit(2, CancellationToken::new()).unwrap();
        // The head is arriving when the cap evicts it, and completes before
        // the connection's task closes it.
        conn.bytes_arrived();
        assert!(open.evict_longest_idle());
        assert!(conn.evict.is_cancelled());
        let Ok(response) = handle(
            Request::new(Body::empty()),
            router.clone(),
            conn.clone(),
            limits(),
        )
        .await;
        assert_eq!(response.status(), 503);
        assert_eq!(response.headers()[header::CONNECTION], "close");
        let body = axum::body::to_bytes(Body::new(response.into_body()), 4096)
            .await
            .unwrap();
        let body: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(body["error"]["code"], "connection_evicted");
        assert_eq!(routed.load(Ordering::Relaxed), 0, "never routed");

        // A connection that was not evicted is routed.
        let (_, other) = open.admit(2, CancellationToken::new()).unwrap();
        let Ok(response) = handle(Request::new(Body::empty()), router, other, limits()).await;
        assert_eq!(response.status(), 200);
        assert_eq!(routed.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn eviction_skips_a_connection_that_started_a_request_or_is_still_sending() {
        let open = Registry::default();
        let (_, oldest) = open.admit(3, CancellationToken::new()).unwrap();
        let (_, sending) = open.admit(3, CancellationToken::new()).unwrap();
        let (_, newest) = open.admit(3, CancellationToken::new()).unwrap();
        let busy = Busy::enter(oldest.clone()).unwrap();
        // `sending` finished its answer but the client has not read it all.
        drop(Busy::enter(sending.clone()).unwrap());
        sending.write_blocked();
        assert_eq!(sending.deadline(&limits()), None, "no timer while sending");
        let (_, fourth) = open.admit(3, CancellationToken::new()).unwrap();
        assert!(newest.evict.is_cancelled(), "the one waiting was evicted");
        let _fourth = Busy::enter(fourth).unwrap();
        assert!(!oldest.evict.is_cancelled() && !sending.evict.is_cancelled());
        assert!(
            Busy::enter(newest.clone()).is_none(),
            "an evicted connection never becomes busy"
        );
        // Now every live connection is busy or sending: a new one is refused.
        assert!(open.admit(3, CancellationToken::new()).is_none());
        drop(busy);
        // Once the rest is sent, idle (and evictable) again, from now.
        sending.write_progressed();
        assert!(sending.deadline(&limits()).is_some());
    }

    #[test]
    fn bytes_of_a_next_request_while_busy_leave_busy_in_the_head() {
        let conn = Arc::new(Conn::new(CancellationToken::new()));
        let limits = limits();
        // Body bytes while busy are the request's own.
        let busy = Busy::enter(conn.clone()).unwrap();
        conn.bytes_arrived();
        drop(busy);
        let idle = conn.deadline(&limits).unwrap();
        assert!(idle > Instant::now() + limits.header, "idle: {idle:?}");
        // After the body, they are the next request's head.
        let busy = Busy::enter(conn.clone()).unwrap();
        conn.body_done();
        conn.bytes_arrived();
        drop(busy);
        let head = conn.deadline(&limits).unwrap();
        assert!(head <= Instant::now() + limits.header, "head: {head:?}");
    }
}
