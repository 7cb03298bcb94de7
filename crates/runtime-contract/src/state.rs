//! Typed per-run state: keys that plugins own and hooks read and write.

use serde::Serialize;
use serde::de::DeserializeOwned;

/// A typed slot in a run's state, identified by `KEY`.
///
/// Every run starts with `Value::default()` for each registered key. A key
/// has exactly one owner among an agent's listed plugins.
///
/// ```
/// use rein_runtime_contract::state::StateKey;
///
/// struct Visits;
/// impl StateKey for Visits {
///     const KEY: &'static str = "example.visits";
///     type Value = u32;
/// }
/// assert_eq!(Visits::KEY, "example.visits");
/// ```
pub trait StateKey: Send + Sync + 'static {
    /// The key's unique name; use a `plugin.name` prefix.
    const KEY: &'static str;
    /// The value stored under it.
    type Value: Default + Clone + Send + Sync + Serialize + DeserializeOwned + 'static;
}

/// A failed state registration or access.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StateError {
    /// Two listed plugins (or one plugin twice) registered the same key.
    #[error("state key \"{key}\" is already registered; only one plugin of an agent may own it")]
    KeyAlreadyRegistered {
        /// The key.
        key: String,
    },
    /// The key is not registered for this agent.
    #[error(
        "state key \"{key}\" is not registered for this agent; list the plugin that owns it in plugin_ids"
    )]
    UnknownKey {
        /// The key.
        key: String,
    },
    /// A plugin was configured with values it cannot work with.
    #[error("invalid plugin configuration: {message}")]
    InvalidConfig {
        /// What is wrong and how to fix it.
        message: String,
    },
    /// The key is registered with a different value type.
    #[error("state key \"{key}\" holds a different value type than the one requested")]
    TypeMismatch {
        /// The key.
        key: String,
    },
}
