//! [`Notification`]: what processes tell each other through `NOTIFY`, as a
//! typed enum, and [`Listener`], which receives them.
//!
//! The statements of this crate send them at commit; this module is the
//! one place that knows their channels and payloads. They make things
//! fast; every reader also polls, so a lost notification only delays.
//!
//! | channel | payload | variant |
//! |---|---|---|
//! | `rein_work` | `i:<thread>` / `e:<thread>` | [`Notification::Work`] (interrupt or not) |
//! | `rein_work` | `r:<thread>` | [`Notification::Released`] |
//! | `rein_events` | `e:<run>` / `f:<run>` | [`Notification::Events`] (finished or not) |
//! | `rein_cancel` | `run:<run>` | [`Notification::CancelRun`] |
//! | `rein_cancel` | `call:<run> <call>` | [`Notification::CancelToolCall`] |
//! | `rein_cancel` | `decide:<run>` | [`Notification::Decided`] |

use sqlx::postgres::{PgListener, PgPool};

/// The channels every process listens to.
const CHANNELS: [&str; 3] = ["rein_work", "rein_events", "rein_cancel"];

/// Something another process (or this one) committed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Notification {
    /// A thread has a new submission; `interrupt` when it must reach the
    /// thread's running run at once.
    Work {
        /// The thread.
        thread_id: String,
        /// Whether the submission interrupts.
        interrupt: bool,
    },
    /// A thread's holder gave its lease up.
    Released {
        /// The thread.
        thread_id: String,
    },
    /// A run has new events; `finished` when its record is final too.
    Events {
        /// The run.
        run_id: String,
        /// Whether the run finished.
        finished: bool,
    },
    /// A running run is asked to cancel.
    CancelRun {
        /// The run.
        run_id: String,
    },
    /// A call a parked run waits on was decided (read the run's decisions).
    Decided {
        /// The run.
        run_id: String,
    },
    /// One tool call of a running run is asked to end.
    CancelToolCall {
        /// The run.
        run_id: String,
        /// The call.
        call_id: String,
    },
}

impl Notification {
    /// Parses a notification; `None` for a channel or payload this version
    /// does not know.
    pub fn parse(channel: &str, payload: &str) -> Option<Self> {
        let owned = |s: &str| s.to_owned();
        match (channel, payload.split_once(':')) {
            ("rein_work", Some(("i" | "e", thread))) => Some(Self::Work {
                thread_id: owned(thread),
                interrupt: payload.starts_with('i'),
            }),
            ("rein_work", Some(("r", thread))) => Some(Self::Released {
                thread_id: owned(thread),
            }),
            ("rein_events", Some(("e" | "f", run))) => Some(Self::Events {
                run_id: owned(run),
                finished: payload.starts_with('f'),
            }),
            ("rein_cancel", Some(("run", run))) => Some(Self::CancelRun { run_id: owned(run) }),
            ("rein_cancel", Some(("decide", run))) => Some(Self::Decided { run_id: owned(run) }),
            ("rein_cancel", Some(("call", rest))) => {
                let (run, call) = rest.split_once(' ')?;
                Some(Self::CancelToolCall {
                    run_id: owned(run),
                    call_id: owned(call),
                })
            }
            _ => None,
        }
    }

    /// The channel and payload the statements send for it.
    pub fn encode(&self) -> (&'static str, String) {
        match self {
            Self::Work {
                thread_id,
                interrupt,
            } => (
                "rein_work",
                format!("{}:{thread_id}", if *interrupt { "i" } else { "e" }),
            ),
            Self::Released { thread_id } => ("rein_work", format!("r:{thread_id}")),
            Self::Events { run_id, finished } => (
                "rein_events",
                format!("{}:{run_id}", if *finished { "f" } else { "e" }),
            ),
            Self::CancelRun { run_id } => ("rein_cancel", format!("run:{run_id}")),
            Self::Decided { run_id } => ("rein_cancel", format!("decide:{run_id}")),
            Self::CancelToolCall { run_id, call_id } => {
                ("rein_cancel", format!("call:{run_id} {call_id}"))
            }
        }
    }
}

/// A connection listening to every channel of [`Notification`].
#[derive(Debug)]
pub struct Listener {
    inner: PgListener,
}

impl Listener {
    /// Connects and listens.
    ///
    /// # Errors
    ///
    /// The database could not be reached.
    ///
    /// # Cancel safety
    ///
    /// Dropped midway, nothing is listening.
    pub async fn connect(pool: &PgPool) -> Result<Self, sqlx::Error> {
        let mut inner = PgListener::connect_with(pool).await?;
        inner.listen_all(CHANNELS).await?;
        Ok(Self { inner })
    }

    /// The next notification (`None` for one this version does not know).
    ///
    /// # Errors
    ///
    /// The connection broke: connect again (and poll for what was missed).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a notification not yet returned stays queued.
    pub async fn recv(&mut self) -> Result<Option<Notification>, sqlx::Error> {
        let n = self.inner.recv().await?;
        Ok(Notification::parse(n.channel(), n.payload()))
    }
}

#[cfg(test)]
mod tests {
    use super::Notification;

    #[test]
    fn every_notification_parses_back_from_what_it_encodes() {
        let all = [
            Notification::Work {
                thread_id: "t:1".into(),
                interrupt: true,
            },
            Notification::Work {
                thread_id: "t".into(),
                interrupt: false,
            },
            Notification::Released {
                thread_id: "t".into(),
            },
            Notification::Events {
                run_id: "run-a-1".into(),
                finished: true,
            },
            Notification::Events {
                run_id: "r".into(),
                finished: false,
            },
            Notification::CancelRun { run_id: "r".into() },
            Notification::CancelToolCall {
                run_id: "r".into(),
                call_id: "call 1".into(),
            },
        ];
        for n in all {
            let (channel, payload) = n.encode();
            assert_eq!(Notification::parse(channel, &payload), Some(n));
        }
        assert_eq!(Notification::parse("rein_work", "x:t"), None);
        assert_eq!(Notification::parse("other", "i:t"), None);
    }
}
