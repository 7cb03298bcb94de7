//! `rein check --probe`: each model of the deployment asked for one token,
//! once, so that a dead server, a wrong port, a bad key or a misspelled
//! model name shows up before the first run rather than as retries in it.
//!
//! A probe opens one inference (`"ping"`, at most one output token) and
//! stops at the provider's first answer: the model was found and the key
//! accepted. Models on the same provider with the same upstream name are
//! probed once. `scripted` providers have nothing to reach and are
//! skipped. What a failure says is the provider's error, classified (not
//! reachable, does not know the model, refuses the key), never its URL or
//! key.

use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use rein::contract::inference::{InferenceErrorKind, InferenceRequest};
use rein::prelude::Message;

use crate::assemble;
use crate::deployment::{Deployment, ProviderConfig};

/// How long one probe may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The model id in the file.
    pub model: String,
    /// Its provider's id.
    pub provider: String,
    /// `None` when the provider answered; else what went wrong.
    pub failure: Option<String>,
}

impl std::fmt::Display for Probe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.failure {
            None => write!(
                f,
                "ok: model \"{}\" on provider \"{}\" answered",
                self.model, self.provider
            ),
            Some(why) => write!(
                f,
                "model \"{}\" on provider \"{}\": {why}",
                self.model, self.provider
            ),
        }
    }
}

/// Probes every model of `deployment` whose provider is not `scripted`,
/// one at a time, in file order.
///
/// # Cancel safety
///
/// Dropping the future drops the inference in flight (its connection
/// closes); nothing is left running.
pub async fn probe(deployment: &Deployment) -> Vec<Probe> {
    let mut seen = BTreeSet::new();
    let mut probes = Vec::new();
    for (id, model) in &deployment.models {
        let Some(provider) = deployment.providers.get(&model.provider) else {
            continue;
        };
        if matches!(provider, ProviderConfig::Scripted { .. })
            || !seen.insert((model.provider.clone(), model.model.clone()))
        {
            continue;
        }
        let failure = match assemble::executor(&model.provider, provider) {
            Err(e) => Some(e.to_string()),
            Ok(executor) => {
                let mut request = InferenceRequest::new(&model.model, vec![Message::user("ping")]);
                request.max_output_tokens = Some(1);
                let answer = async {
                    let mut stream = executor.open(&request).await?;
                    match stream.next().await {
                        Some(Err(e)) => Err(e),
                        _ => Ok(()),
                    }
                };
                match tokio::time::timeout(PROBE_TIMEOUT, answer).await {
                    Ok(Ok(())) => None,
                    Ok(Err(e)) => Some(match e.kind() {
                        InferenceErrorKind::Connection | InferenceErrorKind::Timeout => {
                            format!("does not answer: {e}")
                        }
                        InferenceErrorKind::NotFound => {
                            format!("does not know model \"{}\": {e}", model.model)
                        }
                        InferenceErrorKind::Unauthorized => format!("refuses the key: {e}"),
                        _ => format!("failed: {e}"),
                    }),
                    Err(_) => Some(format!(
                        "does not answer: no answer within {} s",
                        PROBE_TIMEOUT.as_secs()
                    )),
                }
            }
        };
        probes.push(Probe {
            model: id.clone(),
            provider: model.provider.clone(),
            failure,
        });
    }
    probes
}
