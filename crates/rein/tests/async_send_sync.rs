//! Every public future is `Send`, and the shared types are `Send + Sync + 'static`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

use std::sync::Arc;

use rein::contract::inference::LlmExecutor;
use rein::prelude::*;

fn is_send<T: Send>(_: &T) {}
fn is_send_sync<T: Send + Sync + 'static>() {}

#[test]
fn shared_types_are_send_and_sync() {
    is_send_sync::<AgentRuntime>();
    is_send_sync::<Mailbox>();
    is_send_sync::<RunHandle>();
    is_send_sync::<CollectingSink>();
    is_send_sync::<RunRequest>();
    is_send_sync::<AgentRunResult>();
    is_send_sync::<BuildError>();
    is_send_sync::<RuntimeError>();
    is_send_sync::<HookError>();
    is_send_sync::<StateError>();
    is_send_sync::<InferenceError>();
    is_send_sync::<ToolError>();
    is_send_sync::<Arc<dyn Tool>>();
    is_send_sync::<Arc<dyn Plugin>>();
    is_send_sync::<Arc<dyn PhaseHook>>();
    is_send_sync::<Arc<dyn LlmExecutor>>();
    is_send_sync::<Arc<dyn EventSink>>();
    is_send_sync::<TerminalPrinter>();
}

fn is_send_unpin_stream<S: futures::Stream<Item = AgentEvent> + Send + Unpin + 'static>(_: &S) {}

#[tokio::test]
async fn a_run_stream_is_a_send_unpin_stream_of_events_and_its_futures_are_send() {
    let runtime = AgentRuntimeBuilder::new().build().unwrap();
    let stream = runtime.run_stream(RunRequest::new("t", vec![]));
    is_send_unpin_stream(&stream);
    is_send(
        &runtime
            .mailbox()
            .submit_stream(RunRequest::new("t", vec![])),
    );
    is_send(&TerminalPrinter::new().print_stream(runtime.run_stream(RunRequest::new("t", vec![]))));
    is_send(&stream.wait());
}

#[test]
fn runtime_futures_are_send() {
    let runtime = AgentRuntimeBuilder::new().build().unwrap();
    let request = || RunRequest::new("t", vec![]);
    is_send(&runtime.run(request(), Arc::new(CollectingSink::new())));
    is_send(&runtime.run_to_completion(request()));
    is_send(&runtime.thread_messages("t"));
    is_send(&runtime.cancel_and_wait_by_thread("t"));
    is_send(&runtime.shutdown());
    is_send(&runtime.mailbox().submit(request()));
}
