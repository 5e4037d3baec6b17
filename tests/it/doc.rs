//! Issue #47, items 3-5: `acpo doc` writes a document through its link, keeping its mode and
//! owner; refuses generated text that holds a block marker (which made every fill change the
//! document again); and fills several documents together or none, leaving no temporary behind.

use std::path::Path;
use std::process::{Command, Output};

fn doc(args: &[&Path], from: &Path, check: bool) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_acpo"));
    c.arg("doc").args(args).arg("--from").arg(from);
    if check {
        c.arg("--check");
    }
    c.output().expect("acpo runs")
}

const BLANK: &str = "# Title\n\n<!-- begin: table.md -->\nold\n<!-- end: table.md -->\n\nend\n";
const FILLED: &str = "# Title\n\n<!-- begin: table.md -->\n| a |\n<!-- end: table.md -->\n\nend\n";

/// A folder of generated files holding `table.md`.
fn generated(dir: &Path) -> std::path::PathBuf {
    let from = dir.join("generated");
    std::fs::create_dir_all(&from).expect("mkdir");
    std::fs::write(from.join("table.md"), "| a |\n").expect("w");
    from
}

/// Every `*.tmp` (an interrupted or failed write's leftover) under `dir`.
fn temps(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).expect("ls") {
        let p = e.expect("e").path();
        let name = p.file_name().expect("n").to_string_lossy().to_string();
        if acpo::atomic::is_temp(&name) {
            out.push(name);
        }
    }
    out
}

/// Item 3: a document that is a link is filled through it (the link stays a link, its target
/// gets the text), and a document's permissions and owner are those it had.
#[cfg(unix)]
#[test]
fn doc_writes_through_a_link_keeping_mode_and_owner() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = tempfile::tempdir().expect("tmp");
    let from = generated(tmp.path());
    let target = tmp.path().join("real/DOC.md");
    std::fs::create_dir_all(target.parent().expect("p")).expect("mkdir");
    std::fs::write(&target, BLANK).expect("w");
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    // A group and owner other than the writer's where this process may give them (root).
    let root = unsafe { libc::geteuid() } == 0;
    if root {
        std::os::unix::fs::chown(&target, Some(4242), Some(4343)).expect("chown");
    }
    let link = tmp.path().join("DOC.md");
    std::os::unix::fs::symlink(&target, &link).expect("link");

    let out = doc(&[&link], &from, false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        std::fs::symlink_metadata(&link)
            .expect("meta")
            .file_type()
            .is_symlink(),
        "the link was replaced by a file"
    );
    assert_eq!(std::fs::read_to_string(&target).expect("r"), FILLED);
    let meta = std::fs::metadata(&target).expect("meta");
    assert_eq!(meta.permissions().mode() & 0o7777, 0o600, "mode changed");
    if root {
        assert_eq!((meta.uid(), meta.gid()), (4242, 4343), "owner changed");
    }
    assert_eq!(temps(target.parent().expect("p")), Vec::<String>::new());
    assert!(
        doc(&[&link], &from, true).status.success(),
        "--check passes"
    );
}

/// Item 4: a generated file holding a block marker is refused, naming it, and the document is
/// left as it was (before: each fill changed it again and --check never passed).
#[test]
fn generated_text_holding_a_block_marker_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let from = generated(tmp.path());
    let target = tmp.path().join("DOC.md");
    for body in [
        "| a |\n<!-- end: table.md -->\nmore\n",
        "x <!-- begin: other.md --> y\n",
        "<!-- end: other.md -->\n",
    ] {
        std::fs::write(from.join("table.md"), body).expect("w");
        std::fs::write(&target, BLANK).expect("w");
        for check in [false, true] {
            let out = doc(&[&target], &from, check);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{body:?}: {stderr}");
            assert!(
                stderr.contains("table.md") && stderr.contains("block marker"),
                "{stderr}"
            );
            assert_eq!(std::fs::read_to_string(&target).expect("r"), BLANK);
        }
    }
}

/// Item 5: `acpo doc A B` with B unfillable leaves A as it was; B failing where its new text is
/// staged (a directory squats on its temporary's name) leaves A untouched and no temporary of
/// A's behind; with both fillable both are written.
#[test]
fn several_documents_are_filled_together_or_not_at_all() {
    let tmp = tempfile::tempdir().expect("tmp");
    let from = generated(tmp.path());
    let a = tmp.path().join("A.md");
    let b = tmp.path().join("B.md");
    std::fs::write(&a, BLANK).expect("w");
    // B names a block without its end: refused when spliced.
    std::fs::write(&b, "<!-- begin: table.md -->\nno end\n").expect("w");
    let out = doc(&[&a, &b], &from, false);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("B.md"));
    assert_eq!(
        std::fs::read_to_string(&a).expect("r"),
        BLANK,
        "A rewritten"
    );

    // B fine to splice, but its temporary cannot be made.
    std::fs::write(&b, BLANK).expect("w");
    let squat = acpo::atomic::temp_path(&b);
    std::fs::create_dir_all(squat.join("inside")).expect("mkdir");
    let out = doc(&[&a, &b], &from, false);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("B.md"));
    assert_eq!(
        std::fs::read_to_string(&a).expect("r"),
        BLANK,
        "A rewritten"
    );
    assert_eq!(std::fs::read_to_string(&b).expect("r"), BLANK);
    assert!(
        !acpo::atomic::temp_path(&a).exists(),
        "A.md.tmp left behind"
    );
    assert!(
        squat.join("inside").is_dir(),
        "what squatted is left as it was"
    );
    std::fs::remove_dir_all(&squat).expect("rm");

    let out = doc(&[&a, &b], &from, false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for d in [&a, &b] {
        assert_eq!(std::fs::read_to_string(d).expect("r"), FILLED);
    }
    assert_eq!(temps(tmp.path()), Vec::<String>::new());
    // Idempotent: filled again, nothing changes and --check passes.
    assert!(doc(&[&a, &b], &from, false).status.success());
    assert_eq!(std::fs::read_to_string(&a).expect("r"), FILLED);
    assert!(doc(&[&a, &b], &from, true).status.success());
}
