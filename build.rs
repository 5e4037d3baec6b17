//! Records the git commit and the versions of the crates that decide the numbers, for each
//! run's provenance.json (a binary built outside a git checkout says "unknown").

fn main() {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into());
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .is_some_and(|o| !o.stdout.is_empty());
    println!(
        "cargo:rustc-env=ACPO_GIT_COMMIT={commit}{}",
        if dirty { "-dirty" } else { "" }
    );
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let mut versions = Vec::new();
    for name in [
        "candle-core",
        "candle-nn",
        "tokenizers",
        "polars",
        "hf-hub",
        "plotters",
    ] {
        let needle = format!("name = \"{name}\"\nversion = \"");
        if let Some(i) = lock.find(&needle) {
            let rest = &lock[i + needle.len()..];
            versions.push(format!("{name}={}", rest.split('"').next().unwrap_or("?")));
        }
    }
    println!("cargo:rustc-env=ACPO_CRATE_VERSIONS={}", versions.join(","));
    println!("cargo:rerun-if-changed=Cargo.lock");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/index");
}
