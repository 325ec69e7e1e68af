//! Tidy checks: the layering rule and house conventions, as ordinary tests over the source
//! tree.
//!
//! The layering rule: only `providers/local` touches the OS process world (processes,
//! signals, pids, `/proc`, PTYs). Test crates (`tests/`, `conformance/`) are exempt:
//! they judge providers by their effect on the machine (`conch conformance` links the
//! conformance crate for that same judging). The benchmarks, the `conch-bench` binary
//! (`src/bin/conch-bench/bench.rs`, `floors.rs`, `files_bench.rs`), spawn raw processes as
//! the floors they measure against, and its remote and scale benches (`remote_bench.rs`,
//! `scale_bench.rs`) read their own resident memory (the scale bench also its threads, CPU
//! time and children, and those of the daemon it starts);
//! `conch bench` (`src/cli/bench.rs`) execs that binary in place of itself. The sandbox
//! runners (`providers/sandbox`) are the other place OS confinement lives: its `sandbox-exec`
//! helper (`exec.rs`) confines its own process with libc calls (close_range, setsid,
//! capset, prctl, Landlock, seccomp) before it execs the command, and `bwrap.rs` starts
//! bubblewrap once at build to probe that it can create namespaces (and names `/proc` in
//! the mount arguments it builds). The host files provider (`providers/files`) reaches the
//! filesystem through nix's and libc's `*at` calls (`openat2` is how it confines writes): it
//! may name `nix::` and `libc::`, never processes, signals, PTYs or `/proc`.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Every crate directory of the workspace (each with a Cargo.toml), from the root manifest.
fn members() -> Vec<PathBuf> {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let list = manifest.split("members = [").nth(1).unwrap().split(']').next().unwrap();
    let mut out: Vec<PathBuf> = list
        .split(',')
        .map(|m| m.trim().trim_matches('"'))
        .filter(|m| !m.is_empty())
        .map(|m| root().join(m))
        .collect();
    out.push(root());
    out
}

/// The test crates, and the conformance suites, which judge providers by their effect on the
/// machine (the shipped binary links them for `conch conformance`, so they live outside
/// `tests/`).
fn is_test_crate(dir: &Path) -> bool {
    dir.starts_with(root().join("tests")) || dir.starts_with(root().join("conformance"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name().to_string_lossy().into_owned();
        if p.is_dir() {
            // Nested crates are visited as members of their own; `target` is build output.
            if name != "target" && !p.join("Cargo.toml").exists() {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

/// A crate's own source files (not those of crates nested below it).
fn sources(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in ["src", "tests", "benches"] {
        rust_files(&dir.join(sub), &mut out);
    }
    if dir != root() {
        // Crates whose sources sit at the top (tests/lib.rs, tests/it).
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            } else if p.is_dir() && e.file_name() != "src" && !p.join("Cargo.toml").exists() {
                rust_files(&p, &mut out);
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Product code of a file: everything before its `#[cfg(test)] mod tests`, and nothing of
/// files that are test modules themselves.
fn product_code(path: &Path) -> String {
    let name = path.file_name().unwrap().to_string_lossy();
    if name == "tests.rs"
        || name.ends_with("_tests.rs")
        || path.components().any(|c| c.as_os_str() == "tests")
    {
        return String::new();
    }
    let text = std::fs::read_to_string(path).unwrap();
    match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// `pat` occurs in `line` not as the tail of a longer name (`unix::` is not `nix::`).
fn mentions(line: &str, pat: &str) -> bool {
    line.match_indices(pat).any(|(i, _)| {
        let before = line[..i].chars().next_back();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// `pat` as a whole word, or, for the `"/proc` pattern, the `/proc` filesystem only (not a
/// route such as `"/process.Process/..."`).
fn mentions_forbidden(line: &str, pat: &str) -> bool {
    if pat != "\"/proc" {
        return mentions(line, pat);
    }
    line.match_indices(pat).any(|(i, _)| {
        let next = line[i + pat.len()..].chars().next();
        !next.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '.')
    })
}

#[test]
fn the_proc_pattern_means_the_filesystem_not_a_route() {
    let p = "\"/proc";
    assert!(mentions_forbidden(r#"read("/proc/self/stat")"#, p));
    assert!(mentions_forbidden(r#"Path::new("/proc")"#, p));
    assert!(mentions_forbidden(r#"format!("/proc{}", x)"#, p));
    assert!(!mentions_forbidden(r#"route("/process.Process/{method}")"#, p));
}

fn rel(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

#[test]
fn only_the_local_provider_touches_the_process_world() {
    let local = root().join("providers/local");
    let sandbox = root().join("providers/sandbox");
    // Files of the sandbox crate allowed to touch the OS (see the module doc).
    // The sandbox's own world: the helper confines itself (exec.rs, mounts.rs) and each
    // runner probes its tool once when built (bwrap.rs, landlock.rs).
    let sandbox_os_files = [
        "providers/sandbox/src/exec.rs",
        "providers/sandbox/src/mounts.rs",
        "providers/sandbox/src/bwrap.rs",
        "providers/sandbox/src/landlock.rs",
    ];
    let files = root().join("providers/files");
    let forbidden_deps = ["nix", "libc", "portable-pty", "procfs"];
    let forbidden_code = [
        "\"/proc",
        "tokio::process",
        "std::process::Command",
        "nix::",
        "libc::",
        "killpg",
        "portable_pty",
    ];
    let mut offences = Vec::new();
    for dir in members() {
        if dir == local || is_test_crate(&dir) {
            continue;
        }
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        for line in manifest.lines() {
            let key = line.split(['=', '.']).next().unwrap_or("").trim();
            // The sandbox helper needs libc for its own confinement (nothing else there).
            let sandbox_libc = dir == sandbox && key == "libc";
            // The host files provider's filesystem calls (see the module doc).
            let files_fs = dir == files && matches!(key, "nix" | "libc");
            if forbidden_deps.contains(&key)
                && !manifest.starts_with("[workspace]")
                && !sandbox_libc
                && !files_fs
            {
                offences.push(format!("{}: depends on {key}", rel(&dir.join("Cargo.toml"))));
            }
        }
        for file in sources(&dir) {
            let code = product_code(&file);
            for (n, line) in code.lines().enumerate() {
                let trimmed = line.trim_start();
                if trimmed.starts_with("//") {
                    continue;
                }
                for pat in forbidden_code {
                    let bench_floor =
                        matches!(
                            rel(&file).as_str(),
                            "src/bin/conch-bench/bench.rs"
                                | "src/bin/conch-bench/floors.rs"
                                | "src/bin/conch-bench/files_bench.rs"
                                | "src/bin/conch-bench/engine_bench.rs"
                                | "src/bin/conch-bench/scale_bench.rs"
                        ) && matches!(pat, "tokio::process" | "std::process::Command");
                    // `conch image build` asks the host's dynamic loader (`ldd`) which
                    // libraries a program loads: it reads binaries and manages no process.
                    let image_ldd = rel(&file) == "providers/docker/src/rootfs.rs"
                        && pat == "std::process::Command";
                    // The remote bench reads its own memory use (`/proc/self/status`), a
                    // measurement of itself, not access to another process; the scale bench
                    // also counts its threads, CPU time and children, and its daemon's memory
                    // and children (a daemon it started).
                    let bench_self = matches!(
                        rel(&file).as_str(),
                        "src/bin/conch-bench/remote_bench.rs"
                            | "src/bin/conch-bench/scale_bench.rs"
                    ) && pat == "\"/proc";
                    // `conch bench` replaces its own process with `conch-bench` (an exec, no
                    // child to manage).
                    let bench_exec =
                        rel(&file) == "src/cli/bench.rs" && pat == "std::process::Command";
                    // The files guard names `/proc` to refuse it (the server's, not the
                    // confined command's); it never reads it.
                    let files_refusal =
                        rel(&file) == "providers/files/src/guard.rs" && pat == "\"/proc";
                    let sandbox_os = sandbox_os_files.contains(&rel(&file).as_str())
                        && matches!(pat, "libc::" | "\"/proc" | "std::process::Command");
                    let files_fs = file.starts_with(&files)
                        && matches!(pat, "nix::" | "libc::")
                        && !["signal", "Pid", "pty", "kill", "wait", "fork", "exec"]
                            .iter()
                            .any(|w| mentions(line, w));
                    if mentions_forbidden(line, pat)
                        && !files_fs
                        && !bench_floor
                        && !bench_self
                        && !bench_exec
                        && !files_refusal
                        && !sandbox_os
                        && !image_ldd
                    {
                        offences.push(format!("{}:{}: `{pat}`", rel(&file), n + 1));
                    }
                }
            }
        }
    }
    assert!(offences.is_empty(), "OS access outside providers/local:\n{}", offences.join("\n"));
}

#[test]
fn the_root_manifest_keeps_nix_and_libc_for_the_local_provider_only() {
    // The workspace table may name them (versions live there); members may not, except local.
    let local = std::fs::read_to_string(root().join("providers/local/Cargo.toml")).unwrap();
    assert!(local.contains("nix.workspace") && local.contains("libc.workspace"));
    assert!(
        local.contains("[target.'cfg(unix)'.dependencies]"),
        "the local world states its platform"
    );
}

#[test]
fn folders_name_their_crates() {
    for dir in members() {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        let Some(name) = manifest
            .lines()
            .skip_while(|l| l.trim() != "[package]")
            .find_map(|l| l.strip_prefix("name = "))
            .map(|n| n.trim_matches('"').to_string())
        else {
            continue;
        };
        let r = rel(&dir);
        let expected = if let Some(x) = r.strip_prefix("core/") {
            format!("conch-{x}")
        } else if let Some(x) = r.strip_prefix("providers/") {
            format!("conch-provider-{x}")
        } else if let Some(x) = r.strip_prefix("frontends/") {
            format!("conch-frontend-{x}")
        } else {
            continue;
        };
        assert_eq!(name, expected, "{r} must be the crate {expected}");
    }
}

#[test]
fn every_source_file_says_what_it_is_and_no_test_is_ignored() {
    let mut offences = Vec::new();
    for dir in members() {
        for file in sources(&dir) {
            let text = std::fs::read_to_string(&file).unwrap();
            if !text.starts_with("//!") {
                offences.push(format!("{}: does not start with a `//!` doc", rel(&file)));
            }
            for bad in ["#[ignore", "#[should_panic"] {
                if text.contains(bad) && !file.ends_with("tidy.rs") {
                    offences.push(format!("{}: uses {bad}]", rel(&file)));
                }
            }
        }
    }
    assert!(offences.is_empty(), "{}", offences.join("\n"));
}

/// The dependency lines of a manifest's dependency tables (`[dependencies]`,
/// `[dev-dependencies]`, `[build-dependencies]`, `[target.….dependencies]`): (name, line).
fn dependency_lines(manifest: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut in_deps = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line.trim_end_matches(']').ends_with("dependencies")
                && !line.starts_with("[workspace.");
            continue;
        }
        if !in_deps || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line.split(['=', '.']).next().unwrap_or_default().trim().to_string();
        out.push((name, line.to_string()));
    }
    out
}

#[test]
fn every_dependency_comes_from_the_workspace_table() {
    // One place pins each version, so two crates can never build two versions of one
    // dependency by accident.
    let mut bad = Vec::new();
    for dir in members() {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        for (name, line) in dependency_lines(&manifest) {
            let inherited = line.starts_with(&format!("{name}.workspace = true"))
                || line.contains("workspace = true");
            if !inherited {
                bad.push(format!("{}: {line}", rel(&dir.join("Cargo.toml"))));
            }
        }
    }
    assert!(bad.is_empty(), "declare these in [workspace.dependencies]:\n{}", bad.join("\n"));
}

#[test]
fn core_crates_depend_on_no_provider_or_front_end() {
    let mut bad = Vec::new();
    for dir in members().into_iter().filter(|d| d.starts_with(root().join("core"))) {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        for (name, _) in dependency_lines(&manifest) {
            if name.starts_with("conch-provider-")
                || name.starts_with("conch-frontend-")
                || name == "conch"
            {
                bad.push(format!("{} depends on {name}", rel(&dir)));
            }
        }
    }
    assert!(bad.is_empty(), "core/ holds contracts and services only:\n{}", bad.join("\n"));
}

#[test]
fn no_provider_depends_on_another_provider() {
    // Text two providers share (a shell dialect's framing, say) lives in a core crate, so a
    // provider can be replaced or left out without pulling another one in. The one pair
    // allowed is a family's own wire vocabulary: the remote client compiles against the
    // protocol crate the daemon speaks.
    const FAMILY: &[(&str, &str)] = &[("providers/remote", "conch-provider-remote-proto")];
    let mut bad = Vec::new();
    for dir in members().into_iter().filter(|d| d.starts_with(root().join("providers"))) {
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        for (name, _) in dependency_lines(&manifest) {
            let family = FAMILY.iter().any(|(d, n)| *d == rel(&dir) && *n == name);
            if name.starts_with("conch-provider-") && !family {
                bad.push(format!("{} depends on {name}", rel(&dir)));
            }
        }
    }
    assert!(bad.is_empty(), "providers depend on core crates only:\n{}", bad.join("\n"));
}

/// Characters of a top-level document, counted as text (the diagrams' box drawing counts
/// once per character, not per byte).
fn doc_chars(name: &str) -> (String, usize) {
    let text = std::fs::read_to_string(root().join(name)).unwrap();
    let chars = text.chars().count();
    (text, chars)
}

#[test]
fn architecture_md_stays_a_map() {
    // Issue 24: a map, not an atlas. Mechanism belongs in the `//!` docs of the file that
    // owns it, so the map stays short enough to read whole; one sentence per line keeps
    // lines short and diffs local.
    let (text, chars) = doc_chars("ARCHITECTURE.md");
    assert!(chars <= 12_500, "ARCHITECTURE.md is {chars} characters; the cap is 12500");
    let long: Vec<String> = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.chars().count() > 200)
        .map(|(i, l)| format!("line {}: {} characters", i + 1, l.chars().count()))
        .collect();
    assert!(long.is_empty(), "ARCHITECTURE.md lines over 200 characters:\n{}", long.join("\n"));
}

#[test]
fn readme_stays_a_front_page() {
    // Issue 24: the README says what conch is, how to start and where to read on; each
    // topic lives in docs/.
    let (_, chars) = doc_chars("README.md");
    assert!(
        chars <= 20_500,
        "README.md is {chars} characters; the cap is 20500 (move topics to docs/)"
    );
}

/// The targets of the inline Markdown links of `text` (`[text](target)`), outside fenced
/// code blocks.
fn link_targets(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

#[test]
fn relative_links_in_the_docs_point_at_files() {
    // Moving text between README.md, ARCHITECTURE.md and docs/ must not leave a link behind
    // that points nowhere.
    let mut files = vec![root().join("README.md"), root().join("ARCHITECTURE.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    assert!(!docs.is_empty(), "docs/ holds the topic pages");
    files.extend(docs);
    let mut bad = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for target in link_targets(&text) {
            let path = target.split('#').next().unwrap_or_default();
            if path.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            if !file.parent().unwrap().join(path).exists() {
                bad.push(format!("{}: {target}", rel(file)));
            }
        }
    }
    assert!(bad.is_empty(), "links to files that do not exist:\n{}", bad.join("\n"));
}

/// Every package `name` links, directly or through others, read from Cargo.lock. The lock
/// does not tell dev-dependencies apart, so this over-counts, never under-counts.
fn linked_packages(name: &str) -> std::collections::BTreeSet<String> {
    use std::collections::{BTreeMap, BTreeSet};
    let lock = std::fs::read_to_string(root().join("Cargo.lock")).unwrap();
    // Two versions of one package merge under its name: again an over-count only.
    let mut deps: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for block in lock.split("[[package]]").skip(1) {
        let Some(pkg) = block.lines().find_map(|l| l.strip_prefix("name = ")) else { continue };
        let entry = deps.entry(pkg.trim_matches('"').to_string()).or_default();
        if let Some(list) = block.split("dependencies = [").nth(1) {
            let list = list.split(']').next().unwrap_or_default();
            for d in list.split(',').map(|d| d.trim().trim_matches('"')).filter(|d| !d.is_empty()) {
                // "name" or "name version" when the lock holds more than one version.
                entry.insert(d.split(' ').next().unwrap_or(d).to_string());
            }
        }
    }
    assert!(deps.contains_key(name), "{name} is not in Cargo.lock");
    let mut seen = BTreeSet::new();
    let mut todo = vec![name.to_string()];
    while let Some(p) = todo.pop() {
        for d in deps.get(&p).into_iter().flatten() {
            if seen.insert(d.clone()) {
                todo.push(d.clone());
            }
        }
    }
    seen
}

#[test]
fn the_remote_client_links_no_server_and_the_daemon_no_client() {
    // The wire types are shared; each side's HTTP stack stays its own.
    let rules: [(&str, &[&str]); 3] = [
        ("conch-provider-remote-proto", &["axum", "hyper", "reqwest", "tokio-tungstenite"]),
        ("conch-provider-remote", &["axum", "conch-frontend-sandboxd"]),
        ("conch-frontend-sandboxd", &["reqwest", "conch-provider-remote"]),
    ];
    let mut bad = Vec::new();
    for (krate, forbidden) in rules {
        let linked = linked_packages(krate);
        bad.extend(
            forbidden.iter().filter(|f| linked.contains(**f)).map(|f| format!("{krate} links {f}")),
        );
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

/// A std mutex is taken one way, `conch_sync::LockExt::locked`, whose docs say why a poisoned
/// guard is recovered; a hand-written recovery elsewhere would be a second policy.
#[test]
fn mutexes_are_taken_through_the_one_lock_helper() {
    let helper = root().join("core/sync");
    // Split so this test does not find itself.
    // Any recovery of a poisoned guard by hand, through `lock()`, `get_mut()` or
    // `into_inner()` alike.
    let needle = [
        concat!("lock().unwrap", "_or_else"),
        concat!("PoisonError::", "into_inner"),
        concat!("e.into", "_inner())"),
    ];
    let mut offences = Vec::new();
    for dir in members().into_iter().filter(|d| *d != helper) {
        for file in sources(&dir) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                if needle.iter().any(|s| line.contains(s)) {
                    offences.push(format!("{}:{}", rel(&file), n + 1));
                }
            }
        }
    }
    assert!(offences.is_empty(), "use conch_sync::LockExt::locked: {offences:?}");
}

/// The shipped binary links only crates outside `tests/`: nothing the workspace lets other
/// crates depend on lives there.
#[test]
fn no_dependency_lives_under_tests() {
    let manifest = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let table = manifest.split("[workspace.dependencies]").nth(1).unwrap();
    let table = table.split("\n[").next().unwrap();
    let offences: Vec<&str> = table.lines().filter(|l| l.contains("path = \"tests")).collect();
    assert!(offences.is_empty(), "move these crates out of tests/: {offences:?}");
}
