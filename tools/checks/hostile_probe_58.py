#!/usr/bin/env python3
"""Issue #58, items 1-3 and 10: hostile archives, planted temporaries, failing and concurrent
`reproduce --from`, and `acpo doc`'s nested blocks and huge generated files, through a binary's
command line, each judged held or not, counted by surface. Run it with a binary built before the
fixes and with today's to see the cases fail and hold:

    python3 tools/checks/hostile_probe_58.py BIN [TREE]

TREE is the checkout BIN was built from (its experiments/ and shipped mini archive are used;
default: this repository). Writes only into a fresh temporary directory. One row per case
(surface | case | exit | held | first line said), then tried and held by surface. Every case
must also end within 120 s with exit 0, 1 or 2 (never a panic or a signal), and the archive
cases within 1 GiB of memory (`ulimit -v`).
"""

import gzip
import hashlib
import io
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

BIN = os.path.realpath(sys.argv[1])
TREE = Path(os.path.realpath(sys.argv[2] if len(sys.argv) > 2 else Path(__file__).parent / "../.."))
W = Path(tempfile.mkdtemp(prefix="probe58-"))
TALLY = OrderedDict()
MINI = TREE / "results/mini.tar.gz"


def cap(gib):
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (gib << 30, gib << 30))
    return limit


def run(args, cwd=None, env=None, memory_gib=None):
    try:
        p = subprocess.run([BIN, *map(str, args)], cwd=cwd or W, capture_output=True, text=True,
                           timeout=120, env={**os.environ, **(env or {})},
                           preexec_fn=cap(memory_gib) if memory_gib else None)
        return p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        return 124, "", "still running after 120 s"


def record(surface, case, rc, out, err, held):
    sound = rc in (0, 1, 2) and "panicked" not in err
    held = bool(held) and sound
    said = next((l for l in (err + out).splitlines() if l.strip()), "")[:140]
    print(f"{surface} | {case} | {rc} | {'held' if held else 'FAILED'} | {said}", flush=True)
    t = TALLY.setdefault(surface, [0, 0])
    t[0] += 1
    t[1] += held


def refused(rc, err, *says):
    return rc == 2 and err.startswith("error: ") and all(s in err for s in says)


def failed_check(rc, out, *says):
    return rc == 1 and "FAILED" in out and all(s in out for s in says)


def files(d):
    """Every file under d, relative path -> sha256."""
    out = {}
    for p in sorted(Path(d).rglob("*")):
        if p.is_file() and not p.is_symlink():
            out[p.relative_to(d).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


# ---------------------------------------------------------------------------------------------
# Item 1: archives whose limits used to be walked around.

def header(name, kind, size, fmt=tarfile.USTAR_FORMAT):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = size
    info.mode = 0o755
    return info.tobuf(format=fmt)


def pad(b):
    return b + b"\0" * (-len(b) % 512)


def pax_records(**kv):
    out = b""
    for k, v in kv.items():
        body = f" {k}={v}\n".encode()
        n = len(body) + 1
        while len(str(n)) + len(body) != n:
            n += 1
        out += str(n).encode() + body
    return out


def write_gz(path, chunks):
    with gzip.open(path, "wb", compresslevel=9) as g:
        for c in chunks:
            if isinstance(c, int):
                z = b"\0" * (1 << 20)
                for _ in range(c >> 20):
                    g.write(z)
            else:
                g.write(c)
        g.write(b"\0" * 1024)
    return path


def hostile_archives():
    s = "archive"
    cases = []
    big = 1 << 30
    pax = pax_records(size=big)
    cases.append(("a PAX size of 1 GiB over a 0-byte header",
                  [header("PaxHeader", tarfile.XHDTYPE, len(pax)), pad(pax),
                   header("run-a/metrics.jsonl", tarfile.REGTYPE, 0), big], "decompression bomb"))
    for mib in (64, 512):
        cases.append((f"a GNU long name of {mib} MiB",
                      [header("././@LongLink", tarfile.GNUTYPE_LONGNAME, mib << 20), mib << 20],
                      "GNU long name"))
    pax_big = pax_records(comment="x" * (8 << 20))
    cases.append(("a PAX header of 8 MiB",
                  [header("PaxHeader", tarfile.XHDTYPE, len(pax_big)), pad(pax_big)],
                  "PAX header"))
    many = b"".join(header(f"d{i}/", tarfile.DIRTYPE, 0) for i in range(300_000))
    cases.append(("300,000 directories", [many], "refused"))
    deep = ("a/" * 2000 + "f").encode()
    cases.append(("a path 2,000 levels deep",
                  [header("././@LongLink", tarfile.GNUTYPE_LONGNAME, len(deep)), pad(deep),
                   header("x", tarfile.REGTYPE, 4), pad(b"deep")], "levels"))
    cases.append(("a sparse file",
                  [header("run-a/s", tarfile.GNUTYPE_SPARSE, 0, tarfile.GNU_FORMAT)],
                  "not a regular file or directory"))
    scratch = W / "scratch"
    for i, (case, chunks, says) in enumerate(cases):
        archive = write_gz(W / f"hostile{i}.tar.gz", chunks)
        scratch.mkdir(exist_ok=True)
        rc, out, err = run(["verify", archive], env={"TMPDIR": str(scratch)}, memory_gib=1)
        record(s, f"verify: {case}", rc, out, err,
               failed_check(rc, out, f"hostile{i}.tar.gz", says) and not any(scratch.iterdir()))
        results = W / f"r-hostile{i}"
        rc, out, err = run(["reproduce", "table1", "--scale", "mini", "--from", archive,
                            "--results", results, "--experiments", TREE / "experiments"],
                           memory_gib=1)
        left = [p.name for p in results.iterdir() if not p.name.endswith(".lock")] \
            if results.exists() else []
        record(s, f"reproduce --from: {case}", rc, out, err,
               failed_check(rc, out, says) and not left)
        archive.unlink()
    # The shipped archive still verifies.
    rc, out, err = run(["verify", MINI])
    record(s, "verify the shipped mini archive", rc, out, err, rc == 0 and "OK" in out)


# ---------------------------------------------------------------------------------------------
# Item 2: links planted at the names temporaries used to have.

def planted_links():
    s = "atomic"
    d = W / "links"
    d.mkdir()
    gen = d / "gen"
    gen.mkdir()
    (gen / "t.md").write_text("| a |\n")
    blank = "<!-- begin: t.md -->\nold\n<!-- end: t.md -->\n"
    victim = d / "victim"
    victim.write_text("the victim's")
    os.chmod(victim, 0o600)
    doc = d / "doc.md"
    doc.write_text(blank)
    (d / "doc.md.tmp").symlink_to(victim)
    rc, out, err = run(["doc", doc, "--from", gen])
    record(s, "doc with doc.md.tmp -> victim", rc, out, err,
           rc == 0 and victim.read_bytes() == b"the victim's"
           and (victim.stat().st_mode & 0o777) == 0o600 and not doc.is_symlink()
           and "| a |" in doc.read_text())
    # score --output through a planted link
    answers = d / "answers.jsonl"
    answers.write_text('{"response": "\\\\boxed{4}", "answer": "4"}\n')
    output = d / "scored.jsonl"
    (d / "scored.jsonl.tmp").symlink_to(victim)
    rc, out, err = run(["score", "--input", answers, "--output", output])
    record(s, "score --output with scored.jsonl.tmp -> victim", rc, out, err,
           rc in (0, 2) and victim.read_bytes() == b"the victim's"
           and not output.is_symlink())
    # archive --out through a planted link
    run_dir = d / "run-a"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("{}\n")
    out_archive = d / "runs.tar.gz"
    (d / "runs.tar.gz.tmp").symlink_to(victim)
    rc, out, err = run(["archive", run_dir, "--out", out_archive])
    record(s, "archive --out with runs.tar.gz.tmp -> victim", rc, out, err,
           rc == 0 and victim.read_bytes() == b"the victim's" and not out_archive.is_symlink()
           and run(["verify", out_archive])[0] == 0)


# ---------------------------------------------------------------------------------------------
# Item 3: a failing or concurrent `reproduce --from`.

def reproduce(results, archive):
    return run(["reproduce", "table1", "--scale", "mini", "--from", archive, "--results", results,
                "--figures", W / "figs", "--experiments", TREE / "experiments"])


def failing_from():
    s = "reproduce --from"
    results = W / "r-good"
    rc, out, err = reproduce(results, MINI)
    record(s, "a good run", rc, out, err, rc == 0 and (results / "from-mini/table1.md").is_file())
    before = files(results / "from-mini")
    # The same name, a run missing, resealed.
    t = W / "short"
    t.mkdir()
    with tarfile.open(MINI) as tar:
        tar.extractall(t, filter="data")
    victim = sorted(p for p in t.iterdir() if p.is_dir())[3]
    shutil.rmtree(victim)

    def sums(root):
        lines = []
        for p in sorted(root.rglob("*")):
            if p.is_file() and p != root / "SHA256SUMS":
                lines.append(f"{hashlib.sha256(p.read_bytes()).hexdigest()}  "
                             f"{p.relative_to(root).as_posix()}\n")
        (root / "SHA256SUMS").write_text("".join(lines))
    sums(t)
    short = W / "short-archive"
    short.mkdir()
    with tarfile.open(short / "mini.tar.gz", "w:gz") as tar:
        for p in sorted(t.iterdir()):
            tar.add(p, arcname=p.name)
    rc, out, err = reproduce(results, short / "mini.tar.gz")
    record(s, "then an archive of the same name missing a run", rc, out, err,
           refused(rc, err, victim.name[:-13]) and files(results / "from-mini") == before
           and sorted(p.name for p in results.iterdir()) == [".from-mini.lock", "from-mini"])
    # Two at once into one folder: one is refused (or waits its turn), neither breaks the other.
    outcomes = []

    def one():
        outcomes.append(reproduce(results, MINI))
    threads = [threading.Thread(target=one) for _ in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    codes = sorted(o[0] for o in outcomes)
    busy = [o for o in outcomes if o[0] == 2]
    ok = codes in ([0, 0], [0, 2]) and all("another `--from`" in o[2] for o in busy)
    record(s, "two at once into one folder", codes[-1], "", " / ".join(o[2][:80] for o in busy),
           ok and files(results / "from-mini") == before)


# ---------------------------------------------------------------------------------------------
# Item 10: acpo doc.

def doc():
    s = "doc"
    d = W / "doc"
    d.mkdir()
    gen = d / "gen"
    gen.mkdir()
    (gen / "a.md").write_text("| a |\n")
    (gen / "b.md").write_text("| b |\n")
    target = d / "DOC.md"
    for case, text in [
        ("b nested in a", "<!-- begin: a.md -->\n<!-- begin: b.md -->\nx\n<!-- end: b.md -->\n"
                          "<!-- end: a.md -->\n"),
        ("a GPU block nested in a", "<!-- begin: a.md -->\n<!-- begin: gpu.md -->\nkeep\n"
                                    "<!-- end: gpu.md -->\n<!-- end: a.md -->\n"),
        ("a and b crossing", "<!-- begin: a.md -->\n1\n<!-- begin: b.md -->\n2\n"
                             "<!-- end: a.md -->\n3\n<!-- end: b.md -->\n"),
        ("a stray end in a", "<!-- begin: a.md -->\n<!-- end: b.md -->\n<!-- end: a.md -->\n"),
    ]:
        target.write_text(text)
        rc, out, err = run(["doc", target, "--from", gen])
        record(s, case, rc, out, err,
               refused(rc, err, "DOC.md", "nested") and target.read_text() == text)
    target.write_text("<!-- begin: a.md -->\nold\n<!-- end: a.md -->\n")
    with open(gen / "a.md", "wb") as f:
        f.truncate(300 << 20)
    rc, out, err = run(["doc", target, "--from", gen], memory_gib=1)
    record(s, "a 300 MB generated file under a 1 GiB cap", rc, out, err,
           refused(rc, err, "a.md", "larger than") and "old" in target.read_text())
    huge_doc = d / "HUGE.md"
    with open(huge_doc, "wb") as f:
        f.truncate(300 << 20)
    rc, out, err = run(["doc", huge_doc, "--from", gen], memory_gib=1)
    record(s, "a 300 MB document under a 1 GiB cap", rc, out, err,
           refused(rc, err, "HUGE.md", "larger than"))


def main():
    print("surface | case | exit | held | said")
    probes = [hostile_archives, planted_links, failing_from, doc]
    # PROBES=planted_links,doc: only those surfaces.
    only = os.environ.get("PROBES")
    for probe in probes:
        if not only or probe.__name__ in only.split(","):
            probe()
    print("\nsurface | tried | held")
    for surface, (tried, held) in TALLY.items():
        print(f"{surface} | {tried} | {held}")
    total = [sum(t[i] for t in TALLY.values()) for i in (0, 1)]
    print(f"all | {total[0]} | {total[1]}")
    shutil.rmtree(W, ignore_errors=True)


if __name__ == "__main__":
    main()
