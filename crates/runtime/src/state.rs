//! The per-run typed state map and the registry of keys an agent's plugins own.
//!
//! **Invariant:** a key has exactly one owner among an agent's listed plugins;
//! registering it twice fails with [`StateError::KeyAlreadyRegistered`].

use std::any::Any;
use std::collections::BTreeMap;

use rein_runtime_contract::state::{StateError, StateKey};

type Slot = Box<dyn Any + Send + Sync>;

/// One registered key: its name, its owner and how to make its initial value.
#[derive(Clone)]
pub(crate) struct KeyRegistration {
    pub(crate) key: &'static str,
    pub(crate) owner: String,
    init: fn() -> Slot,
    /// Set for exported keys: renders the run's final value as JSON.
    pub(crate) export: Option<fn(&Slot) -> Option<serde_json::Value>>,
}

impl std::fmt::Debug for KeyRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRegistration")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .finish()
    }
}

fn init_default<K: StateKey>() -> Slot {
    Box::new(K::Value::default())
}

fn export_json<K: StateKey>(slot: &Slot) -> Option<serde_json::Value> {
    let value = slot.downcast_ref::<K::Value>()?;
    match serde_json::to_value(value) {
        Ok(json) => Some(json),
        Err(error) => {
            tracing::warn!(key = K::KEY, %error, "an exported state value could not be rendered as JSON");
            None
        }
    }
}

impl KeyRegistration {
    pub(crate) fn of<K: StateKey>(owner: &str) -> Self {
        Self {
            key: K::KEY,
            owner: owner.to_owned(),
            init: init_default::<K>,
            export: None,
        }
    }
}

/// Marks the registered key `K` as exported: its final value is copied into
/// the run's result. Fails when no listed plugin registered `K`.
pub(crate) fn export_key<K: StateKey>(keys: &mut [KeyRegistration]) -> Result<(), StateError> {
    match keys.iter_mut().find(|k| k.key == K::KEY) {
        Some(reg) => {
            reg.export = Some(export_json::<K>);
            Ok(())
        }
        None => Err(StateError::UnknownKey {
            key: K::KEY.to_owned(),
        }),
    }
}

/// Adds `reg` to `keys` unless its key is already there.
pub(crate) fn register_key(
    keys: &mut Vec<KeyRegistration>,
    reg: KeyRegistration,
) -> Result<(), StateError> {
    if keys.iter().any(|k| k.key == reg.key) {
        return Err(StateError::KeyAlreadyRegistered {
            key: reg.key.to_owned(),
        });
    }
    keys.push(reg);
    Ok(())
}

/// The typed state of one run: one value per registered key, each starting
/// at its `Default`.
///
/// A list searched in order, not a map: a run has a handful of keys (W2's
/// one), their names are short, and a map's table cost ~100 bytes a run
/// (W2's memory per run) for lookups no faster at this size.
#[derive(Default)]
pub(crate) struct RunState {
    slots: Vec<(&'static str, Slot)>,
}

impl std::fmt::Debug for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set()
            .entries(self.slots.iter().map(|(k, _)| k))
            .finish()
    }
}

impl RunState {
    pub(crate) fn new(keys: &[KeyRegistration]) -> Self {
        // Room for the runtime's own key too (`ensure`).
        let mut slots = Vec::with_capacity(keys.len() + 1);
        slots.extend(keys.iter().map(|k| (k.key, (k.init)())));
        Self { slots }
    }

    fn slot(&self, key: &str) -> Option<&Slot> {
        self.slots.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    fn slot_of(&mut self, key: &str) -> Option<&mut Slot> {
        self.slots
            .iter_mut()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    /// Makes sure `K` has a slot (used for the runtime's own keys).
    pub(crate) fn ensure<K: StateKey>(&mut self) {
        if self.slot(K::KEY).is_none() {
            self.slots.push((K::KEY, init_default::<K>()));
        }
    }

    /// The final values of the exported keys, as JSON by key name.
    pub(crate) fn exports(&self, keys: &[KeyRegistration]) -> BTreeMap<String, serde_json::Value> {
        keys.iter()
            .filter_map(|k| {
                let export = k.export?;
                let value = export(self.slot(k.key)?)?;
                Some((k.key.to_owned(), value))
            })
            .collect()
    }

    pub(crate) fn get<K: StateKey>(&self) -> Result<&K::Value, StateError> {
        self.slot(K::KEY)
            .ok_or_else(|| StateError::UnknownKey {
                key: K::KEY.to_owned(),
            })?
            .downcast_ref()
            .ok_or_else(|| StateError::TypeMismatch {
                key: K::KEY.to_owned(),
            })
    }

    /// `K`'s value when the run has it, with no error built when it has
    /// not (the loop asks every round for keys most runs lack).
    pub(crate) fn slot_mut<K: StateKey>(&mut self) -> Option<&mut K::Value> {
        self.slot_of(K::KEY)?.downcast_mut()
    }

    pub(crate) fn get_mut<K: StateKey>(&mut self) -> Result<&mut K::Value, StateError> {
        self.slot_of(K::KEY)
            .ok_or_else(|| StateError::UnknownKey {
                key: K::KEY.to_owned(),
            })?
            .downcast_mut()
            .ok_or_else(|| StateError::TypeMismatch {
                key: K::KEY.to_owned(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Counter;
    impl StateKey for Counter {
        const KEY: &'static str = "test.counter";
        type Value = u32;
    }
    struct SameNameOtherType;
    impl StateKey for SameNameOtherType {
        const KEY: &'static str = "test.counter";
        type Value = String;
    }
    struct Unregistered;
    impl StateKey for Unregistered {
        const KEY: &'static str = "test.unregistered";
        type Value = u8;
    }

    #[test]
    fn registered_keys_start_at_default_and_are_writable() {
        let mut keys = Vec::new();
        register_key(&mut keys, KeyRegistration::of::<Counter>("p")).unwrap();
        let mut state = RunState::new(&keys);
        assert_eq!(*state.get::<Counter>().unwrap(), 0);
        *state.get_mut::<Counter>().unwrap() += 2;
        assert_eq!(*state.get::<Counter>().unwrap(), 2);
    }

    #[test]
    fn a_key_cannot_be_registered_twice() {
        let mut keys = Vec::new();
        register_key(&mut keys, KeyRegistration::of::<Counter>("a")).unwrap();
        let err = register_key(&mut keys, KeyRegistration::of::<Counter>("b")).unwrap_err();
        assert_eq!(
            err,
            StateError::KeyAlreadyRegistered {
                key: "test.counter".into()
            }
        );
    }

    #[test]
    fn unknown_keys_and_wrong_types_are_errors() {
        let mut keys = Vec::new();
        register_key(&mut keys, KeyRegistration::of::<Counter>("a")).unwrap();
        let state = RunState::new(&keys);
        assert_eq!(
            state.get::<Unregistered>().unwrap_err(),
            StateError::UnknownKey {
                key: "test.unregistered".into()
            }
        );
        assert_eq!(
            state.get::<SameNameOtherType>().unwrap_err(),
            StateError::TypeMismatch {
                key: "test.counter".into()
            }
        );
    }
}
