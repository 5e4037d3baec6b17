//! `acpo export verl` (issue #21): every manifest field accounted for, the 16 paper launches
//! snapshot-tested, the command's files and errors.

use std::path::{Path, PathBuf};

use acpo::manifest::Experiment;
use acpo::verl::{launch, Account, Target};

const TARGET: Target = Target {
    gpus_per_node: 8,
    nodes: 1,
};

fn manifests(dir: &str) -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("experiments")
        .join(dir);
    let mut found: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("experiments")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    found.sort();
    found
}

/// The dotted paths of the leaves a manifest writes (arrays are one leaf; nulls are unwritten,
/// or written as "none", and go to `nulls`).
fn leaves(v: &serde_json::Value, prefix: &str, out: &mut Vec<String>, nulls: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                let path = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(v, &path, out, nulls);
            }
        }
        serde_json::Value::Null => nulls.push(prefix.to_owned()),
        _ => out.push(prefix.to_owned()),
    }
}

#[test]
fn every_field_of_every_shipped_manifest_is_mapped_or_reported() {
    let mut checked = 0;
    for dir in ["paper", "mini", "smoke"] {
        for path in manifests(dir) {
            let (_, raw) = Experiment::load_with_raw(&path).expect("a shipped manifest");
            let l = launch(&raw, &TARGET);
            let accounted: Vec<&str> = l.fields().collect();
            let (mut written, mut nulls) = (Vec::new(), Vec::new());
            let json = serde_json::to_value(&raw).expect("json");
            leaves(&json, "", &mut written, &mut nulls);
            for leaf in &written {
                let covered = accounted
                    .iter()
                    .any(|f| leaf == f || leaf.starts_with(&format!("{f}.")));
                assert!(
                    covered,
                    "{}: `{leaf}` is dropped by the verl launch",
                    path.display()
                );
            }
            // and nothing is accounted for that the manifest has no field for
            for f in &accounted {
                assert!(
                    nulls.iter().any(|w| w == f)
                        || written
                            .iter()
                            .any(|w| w == f || w.starts_with(&format!("{f}."))),
                    "{}: the launch accounts for `{f}`, which the manifest has no field for",
                    path.display()
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 16 + 16, "the paper and mini manifests at least");
}

#[test]
fn the_sixteen_paper_launches_are_as_reviewed() {
    let paper = manifests("paper");
    assert_eq!(paper.len(), 16);
    for path in paper {
        let (exp, raw) = Experiment::load_with_raw(&path).expect("manifest");
        let l = launch(&raw, &TARGET);
        // The paper's runs are all expressible: only acpo's own diagnostics are unsupported.
        let unsupported: Vec<&str> = l.unsupported().map(|n| n.field).collect();
        assert_eq!(
            unsupported,
            ["trainer.tails_every", "trainer.difficulty_probe_k"],
            "{}",
            path.display()
        );
        let shown = format!(
            "{}\n{}",
            l.script(&format!("experiments/paper/{}.yaml", exp.name)),
            l.accounts()
        );
        insta::assert_snapshot!(format!("verl_{}", exp.name), shown);
    }
}

#[test]
fn advantage_clipped_runs_use_the_plugin_and_baselines_verls_own_loss() {
    let get = |name: &str| {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("experiments/paper/{name}.yaml"));
        let (_, raw) = Experiment::load_with_raw(&path).expect("manifest");
        launch(&raw, &TARGET)
    };
    let value = |l: &acpo::verl::Launch, key: &str| {
        l.overrides
            .iter()
            .find(|o| o.key == key)
            .map(|o| o.value.clone())
    };
    let ac = get("qwen3-4b-grpo-ac");
    assert_eq!(
        value(&ac, "actor_rollout_ref.actor.policy_loss.loss_mode").as_deref(),
        Some("acpo")
    );
    assert_eq!(
        value(&ac, "actor_rollout_ref.model.external_lib").as_deref(),
        Some("acpo_verl")
    );
    assert!(value(&ac, "+actor_rollout_ref.actor.policy_loss.alpha").is_some());
    assert_eq!(
        value(&ac, "algorithm.adv_estimator").as_deref(),
        Some("grpo")
    );
    let base = get("qwen3-4b-ppo");
    assert_eq!(
        value(&base, "actor_rollout_ref.actor.policy_loss.loss_mode").as_deref(),
        Some("vanilla")
    );
    assert_eq!(value(&base, "actor_rollout_ref.model.external_lib"), None);
    assert_eq!(
        value(&base, "algorithm.adv_estimator").as_deref(),
        Some("gae")
    );
    assert!(value(&base, "critic.model.path").is_some());
    assert!(
        value(&ac, "critic.model.path").is_none(),
        "GRPO has no critic"
    );
    // A mini manifest's random model is acpo's: reported, not dropped.
    let path = manifests("mini").remove(0);
    let (_, raw) = Experiment::load_with_raw(&path).expect("manifest");
    let mini = launch(&raw, &TARGET);
    assert!(mini
        .notes
        .iter()
        .any(|n| n.field == "model.init" && n.account == Account::Unsupported));
}

#[test]
fn export_verl_writes_an_executable_launch_and_refuses_bad_manifests() {
    let tmp = tempfile::tempdir().expect("tmp");
    let manifest =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/paper/qwen3-8b-ppo-ac.yaml");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(["export", "verl"])
        .arg(&manifest)
        .args(["--gpus", "4", "--out"])
        .arg(tmp.path().join("launch"))
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let script = std::fs::read_to_string(tmp.path().join("launch/launch.sh")).expect("script");
    assert!(script.contains("\"trainer.n_gpus_per_node=4\""));
    assert!(script.starts_with("#!/usr/bin/env bash"));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(tmp.path().join("launch/launch.sh"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111, "executable");
    }
    // The script parses as bash, and refuses to start without the plug-in.
    let syntax = std::process::Command::new("bash")
        .arg("-n")
        .arg(tmp.path().join("launch/launch.sh"))
        .output()
        .expect("bash");
    assert!(
        syntax.status.success(),
        "{}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    let started = std::process::Command::new("bash")
        .arg(tmp.path().join("launch/launch.sh"))
        .env("ACPO_VERL_DATA", tmp.path())
        .env("ACPO_VERL_PLUGIN", tmp.path().join("no-plugin"))
        .output()
        .expect("bash");
    assert_eq!(started.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&started.stderr).contains("acpo_verl/reward.py"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("unsupported by verl: trainer.tails_every"),
        "{stdout}"
    );
    let fields = std::fs::read_to_string(tmp.path().join("launch/fields.md")).expect("fields");
    assert!(
        fields.contains("| algorithm.alpha | `+actor_rollout_ref.actor.policy_loss.alpha=3.0` |")
    );

    // A bad manifest: exit 2, naming the file and the field; nothing written.
    let bad = tmp.path().join("bad.yaml");
    let text = std::fs::read_to_string(&manifest)
        .expect("read")
        .replace("name: qwen3-8b-ppo-ac", "name: bad")
        .replace("  n: 1 ", "  n: 0 ");
    std::fs::write(&bad, text).expect("w");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(["export", "verl"])
        .arg(&bad)
        .arg("--out")
        .arg(tmp.path().join("bad-launch"))
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml") && err.contains("rollout.n"),
        "{err}"
    );
    assert!(!tmp.path().join("bad-launch").exists());
}
