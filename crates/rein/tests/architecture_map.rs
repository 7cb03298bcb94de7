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
    for krate in [
        "runtime-contract",
        "runtime",
        "providers",
        "server",
        "mcp",
        "postgres",
    ] {
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

#[test]
fn no_engine_module_depends_on_auto_mode() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../runtime/src");
    let mut offenders = Vec::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if path != src.join("auto") {
                    stack.push(path);
                }
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let lib = path == src.join("lib.rs");
            for line in text.lines() {
                let code = line.trim_start();
                if code.starts_with("//") {
                    continue;
                }
                // lib.rs declares the module; nothing else may name it.
                let declares = lib && code == "pub mod auto;";
                if !declares && (code.contains("crate::auto") || code.contains("auto::")) {
                    offenders.push(format!("{}: {code}", path.display()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "the engine must not depend on auto mode:\n{}",
        offenders.join("\n")
    );
}
