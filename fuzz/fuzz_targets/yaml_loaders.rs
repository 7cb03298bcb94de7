//! Feeds arbitrary text to the YAML loaders: they must return `Ok` or a
//! `ConfigError`, never panic or hang. Anything that loads must load again
//! identically after a round trip through serde_yaml.
#![no_main]

use libfuzzer_sys::fuzz_target;
use rein_runtime_contract::config::{load_agent_spec_yaml, load_stop_conditions_yaml};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(specs) = load_stop_conditions_yaml(text) {
        let again = serde_yaml::to_string(&specs).expect("specs serialize");
        assert_eq!(load_stop_conditions_yaml(&again).expect("round trip loads"), specs);
    }
    if let Ok(spec) = load_agent_spec_yaml(text) {
        let again = serde_yaml::to_string(&spec).expect("spec serializes");
        assert_eq!(load_agent_spec_yaml(&again).expect("round trip loads"), spec);
    }
});
