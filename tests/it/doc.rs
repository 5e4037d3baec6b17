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
/// staged (its temporary cannot be made) leaves A untouched and no temporary of A's behind;
/// with both fillable both are written.
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

    // A third document fine to splice, but its temporary cannot be made: its name is so long
    // that the temporary's (the name and a suffix) passes the file system's limit.
    std::fs::write(&b, BLANK).expect("w");
    let long = tmp.path().join(format!("{}B.md", "L".repeat(246)));
    std::fs::write(&long, BLANK).expect("w");
    let out = doc(&[&a, &long], &from, false);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("LB.md"));
    assert_eq!(
        std::fs::read_to_string(&a).expect("r"),
        BLANK,
        "A rewritten"
    );
    assert_eq!(std::fs::read_to_string(&long).expect("r"), BLANK);
    assert_eq!(
        temps(tmp.path()),
        Vec::<String>::new(),
        "a temporary left behind"
    );
    std::fs::remove_file(&long).expect("rm");

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

/// Issue #58, item 2: a link planted at the name the writer's temporary used to have
/// (`DOC.md.tmp`) is never written through: the victim keeps its bytes and mode, the document is
/// filled, a regular file, and the planted link is left as it was.
#[cfg(unix)]
#[test]
fn a_planted_temporary_link_is_never_written_through() {
    use std::os::unix::fs::PermissionsExt;
    let tmp = tempfile::tempdir().expect("tmp");
    let from = generated(tmp.path());
    let victim = tmp.path().join("victim.txt");
    std::fs::write(&victim, "the victim's").expect("w");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let target = tmp.path().join("DOC.md");
    std::fs::write(&target, BLANK).expect("w");
    let planted = tmp.path().join("DOC.md.tmp");
    std::os::unix::fs::symlink(&victim, &planted).expect("link");
    let out = doc(&[&target], &from, false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(std::fs::read_to_string(&victim).expect("r"), "the victim's");
    let mode = std::fs::metadata(&victim).expect("m").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the victim's mode changed");
    assert!(std::fs::symlink_metadata(&target)
        .expect("m")
        .file_type()
        .is_file());
    assert_eq!(std::fs::read_to_string(&target).expect("r"), FILLED);
    assert!(std::fs::symlink_metadata(&planted)
        .expect("m")
        .file_type()
        .is_symlink());
}

/// Issue #58, item 10: a block nested in another or crossing it is refused, naming the document
/// and both blocks, and the document is left as it was (before, filling the outer block deleted
/// the inner one, another generator's).
#[test]
fn a_block_nested_in_or_crossing_another_is_refused() {
    let tmp = tempfile::tempdir().expect("tmp");
    let from = generated(tmp.path());
    std::fs::write(from.join("other.md"), "| b |\n").expect("w");
    let target = tmp.path().join("DOC.md");
    for text in [
        // nested: table.md holds other.md's block (other.md's file is absent or present)
        "<!-- begin: table.md -->\nold\n<!-- begin: gpu.md -->\nkept\n<!-- end: gpu.md -->\n<!-- end: table.md -->\n",
        "<!-- begin: table.md -->\n<!-- begin: other.md -->\nx\n<!-- end: other.md -->\n<!-- end: table.md -->\n",
        // crossing: table.md opens, gpu.md opens, table.md ends, gpu.md ends
        "<!-- begin: table.md -->\na\n<!-- begin: gpu.md -->\nb\n<!-- end: table.md -->\nc\n<!-- end: gpu.md -->\n",
        "<!-- begin: gpu.md -->\na\n<!-- begin: table.md -->\nb\n<!-- end: gpu.md -->\nc\n<!-- end: table.md -->\n",
    ] {
        std::fs::write(&target, text).expect("w");
        for check in [false, true] {
            let out = doc(&[&target], &from, check);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{text:?}: {stderr}");
            assert!(
                stderr.contains("DOC.md") && stderr.contains("nested") && !stderr.contains("panicked"),
                "{stderr}"
            );
            let (outer, inner) = if text.starts_with("<!-- begin: gpu.md") {
                ("gpu.md", "table.md")
            } else if text.contains("other.md") {
                ("table.md", "other.md")
            } else {
                ("table.md", "gpu.md")
            };
            assert!(
                stderr.contains(&format!("block `{outer}`")) && stderr.contains(inner),
                "{stderr}"
            );
            assert_eq!(std::fs::read_to_string(&target).expect("r"), text);
        }
    }
}

/// Issue #58, item 10: a generated file larger than a block may quote is refused naming it,
/// read no further than the limit (under a memory cap it would abort the process), and the
/// document is left as it was.
#[test]
fn a_huge_generated_file_is_refused_before_it_is_read_whole() {
    let tmp = tempfile::tempdir().expect("tmp");
    let from = generated(tmp.path());
    let huge = from.join("table.md");
    let file = std::fs::File::create(&huge).expect("create");
    // Sparse: its size costs no disk.
    file.set_len(8 << 30).expect("8 GiB");
    let target = tmp.path().join("DOC.md");
    std::fs::write(&target, BLANK).expect("w");
    let out = doc(&[&target], &from, false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("table.md") && stderr.contains("larger than"),
        "{stderr}"
    );
    assert_eq!(std::fs::read_to_string(&target).expect("r"), BLANK);
}
