//! `docs/architecture.md` names every crate and every top-level module, so
//! the map cannot silently fall behind the code; and the tidy rules every
//! source file keeps (a `//!` paragraph first, `# Cancel safety` on every
//! public async function of the engine, the service and PostgreSQL).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    missing_docs,
    missing_debug_implementations
)]

use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

fn crates() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn every_source_file_opens_with_a_doc_paragraph() {
    let mut offenders = Vec::new();
    for krate in std::fs::read_dir(crates()).unwrap() {
        for file in sources(&krate.unwrap().path().join("src")) {
            let text = std::fs::read_to_string(&file).unwrap();
            if !text.starts_with("//!") {
                offenders.push(file.display().to_string());
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "these files do not open with a `//!` paragraph saying what they own:\n{}",
        offenders.join("\n")
    );
}

#[test]
fn every_public_async_function_of_the_engine_service_and_postgres_documents_cancel_safety() {
    let mut offenders = Vec::new();
    for krate in ["runtime", "service", "postgres"] {
        for file in sources(&crates().join(krate).join("src")) {
            let text = std::fs::read_to_string(&file).unwrap();
            let lines: Vec<&str> = text.lines().collect();
            for (i, line) in lines.iter().enumerate() {
                if !line.trim_start().starts_with("pub async fn") {
                    continue;
                }
                let doc = lines[..i]
                    .iter()
                    .rev()
                    .map(|l| l.trim_start())
                    .skip_while(|l| l.starts_with("#["))
                    .take_while(|l| l.starts_with("///"));
                if !doc.into_iter().any(|l| l.contains("# Cancel safety")) {
                    offenders.push(format!("{}:{}: {}", file.display(), i + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        offenders.is_empty(),
        "document what dropping these midway leaves behind (`# Cancel safety`):\n{}",
        offenders.join("\n")
    );
}

#[test]
fn the_architecture_map_names_every_top_level_module() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let map = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    for krate in [
        "runtime-contract",
        "runtime",
        "providers",
        "service",
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
