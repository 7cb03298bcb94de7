//! `docs/architecture.md` names every crate and every top-level module, so
//! the map cannot silently fall behind the code.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

use std::path::Path;

#[test]
fn the_architecture_map_names_every_top_level_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let map = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    for krate in ["runtime-contract", "runtime", "providers"] {
        assert!(
            map.contains(&format!("crates/{krate}")),
            "crate {krate} missing from the map"
        );
        for entry in std::fs::read_dir(root.join("crates").join(krate).join("src")).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_str().unwrap().to_owned();
            if name == "lib" || name == "mod" {
                continue;
            }
            assert!(
                map.contains(&format!("| `{name}` |")),
                "module {krate}::{name} is missing from docs/architecture.md"
            );
        }
    }
}
