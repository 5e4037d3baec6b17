#!/usr/bin/env python3
"""Issue #47: its kinds of hostile cases through a binary's command line, each judged held or
not, counted by surface. Run it with two binaries (one built before the fixes, in a worktree, and
today's) to see the cases fail and hold:

    python3 tools/checks/hostile_probe_47.py BIN [TREE]

TREE is the checkout BIN was built from (its experiments/, sweeps/ and shipped archives are
used; default: this repository). Writes only into a fresh temporary directory. One row per case
(surface | case | exit | held | first line said), then tried and held by surface. A case holds
when the command did what the issue asks: refused (exit 2, one message naming the file, run,
step or flag) with nothing written, or done exactly (a valid input, byte-identical output). Every
case also must end in 120 s with exit 0, 1 or 2 (never a panic or a signal).
"""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
from collections import OrderedDict
from pathlib import Path

BIN = os.path.realpath(sys.argv[1])
TREE = Path(os.path.realpath(sys.argv[2] if len(sys.argv) > 2 else Path(__file__).parent / "../.."))
W = Path(tempfile.mkdtemp(prefix="probe47-"))
TALLY = OrderedDict()
REPORTS = ["table1.md", "table1.tex", "table1.csv", "regime.md", "seeds.md", "verdict.md",
           "power.md", "speedup.md", "tails.md"]


def run(args, cwd=TREE):
    try:
        p = subprocess.run([BIN, *map(str, args)], cwd=cwd, capture_output=True, text=True,
                           timeout=120)
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


# ---------------------------------------------------------------------------------------------
# reproduce --from: the shipped mini archive, tampered with and resealed.

def sha256(path):
    import hashlib
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def reseal(root):
    """Each run's SHA256SUMS and the top one made again over what is there."""
    def sums(d):
        lines = []
        for p in sorted(d.rglob("*")):
            if p.is_file() and p != d / "SHA256SUMS":
                lines.append(f"{sha256(p)}  {p.relative_to(d).as_posix()}\n")
        (d / "SHA256SUMS").write_text("".join(lines))
    for run_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        sums(run_dir)
    sums(root)


def pack(root, out):
    with tarfile.open(out, "w:gz") as t:
        for p in sorted(root.iterdir()):
            t.add(p, arcname=p.name)
    return out


def unpacked(archive, name):
    d = W / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    with tarfile.open(archive) as t:
        t.extractall(d)
    return d


def runs(root, prefix):
    """The run directories of `root` of the manifest `prefix` names (`mini-s-ppo-`: not the
    mini-s-ppo-ac ones), sorted."""
    exact = re.compile(re.escape(prefix) + r"[0-9a-f]{12}$")
    return sorted(p for p in root.iterdir() if p.is_dir() and exact.match(p.name))


def no_reports(results, stem):
    root = results / f"from-{stem}"
    return not any((root / f).exists() for f in REPORTS)


def tamper_case(surface, case, archive, tamper, says, stem="tampered", extra=()):
    root = unpacked(archive, "t")
    named = tamper(root)
    reseal(root)
    pack(root, W / f"{stem}.tar.gz")
    results = W / "r-from"
    shutil.rmtree(results, ignore_errors=True)
    rc, out, err = run(["reproduce", "all", "--scale", "mini", "--from", W / f"{stem}.tar.gz",
                        "--results", results, "--figures", W / "f-from",
                        "--experiments", TREE / "experiments", *extra])
    record(surface, case, rc, out, err,
           refused(rc, err, *says, *([named] if named else [])) and no_reports(results, stem))


def cut(lines_of):
    def f(run_dir, name):
        p = run_dir / name
        lines = p.read_text().splitlines(keepends=True)
        p.write_text("".join(lines_of(lines)))
    return f


def reproduce_from():
    s = "reproduce --from"
    mini = TREE / "results/mini.tar.gz"
    names = sorted({re.sub(r"-[0-9a-f]{12}$", "", p.name)
                    for p in unpacked(mini, "names").iterdir() if p.is_dir()})
    for n in names:  # one run of each manifest removed
        def t(root, n=n):
            shutil.rmtree(runs(root, n + "-")[-1])
            return None
        tamper_case(s, f"one run of {n} removed", mini, t, ["1 of the 80 runs"])
    for n in ["mini-xs-grpo-ac", "mini-l-ppo"]:
        def t(root, n=n):
            for r in runs(root, n + "-"):
                shutil.rmtree(r)
            return None
        tamper_case(s, f"all 5 runs of {n} removed", mini, t, ["5 of the 80 runs"])
    edits = [
        ("eval.jsonl removed", lambda r: (r / "eval.jsonl").unlink(), "eval.jsonl"),
        ("eval.jsonl emptied", lambda r: (r / "eval.jsonl").write_text(""), "eval.jsonl"),
        ("eval.jsonl's last line removed", lambda r: cut(lambda l: l[:-1])(r, "eval.jsonl"), "eval.jsonl"),
        ("eval.jsonl's first line removed", lambda r: cut(lambda l: l[1:])(r, "eval.jsonl"), "eval.jsonl"),
        ("an eval line doubled", lambda r: cut(lambda l: l[:2] + l[1:])(r, "eval.jsonl"), "eval.jsonl"),
        ("metrics.jsonl emptied", lambda r: (r / "metrics.jsonl").write_text(""), "metrics.jsonl"),
        ("metrics.jsonl removed", lambda r: (r / "metrics.jsonl").unlink(), "metrics.jsonl"),
        ("metrics.jsonl's last line removed", lambda r: cut(lambda l: l[:-1])(r, "metrics.jsonl"), "metrics.jsonl"),
        ("a metrics line doubled", lambda r: cut(lambda l: l[:3] + l[2:])(r, "metrics.jsonl"), "metrics.jsonl"),
        ("provenance.json without its finish", lambda r: (r / "provenance.json").write_text(
            json.dumps({**json.loads((r / "provenance.json").read_text()), "finished_unix": None})),
         "not sealed"),
    ]
    for what, edit, says in edits:
        for n in ["mini-s-grpo-ac-", "mini-m-ppo-"]:
            def t(root, edit=edit, n=n):
                r = runs(root, n)[1]
                edit(r)
                return r.name
            tamper_case(s, f"{what} ({n[:-1]})", mini, t, ["not a complete run", says])
    # The issue's own case: the powered archive with one of its 20 seeds removed.
    powered = TREE / "results/mini-powered.tar.gz"
    def t(root):
        shutil.rmtree(runs(root, "mini-xs-grpo-ac-")[7])
        return None
    tamper_case(s, "powered archive, one of 20 seeds removed", powered, t, ["1 of the 160 runs"],
                stem="powered")
    # --seeds.
    for seeds, says in [("0", "--seeds"), ("-1", "--seeds"), ("4097", "--seeds"),
                        ("18446744073709551615", "--seeds"), ("1e3", "--seeds"), ("abc", "--seeds"),
                        ("inf", "--seeds"), ("NaN", "--seeds"), ("21", "not there"),
                        ("6", "not there"), ("4", "does not expect"), ("1", "does not expect"),
                        ("300", "4096")]:
        results = W / "r-seeds"
        shutil.rmtree(results, ignore_errors=True)
        rc, out, err = run(["reproduce", "table1", "--scale", "mini", "--from", mini, "--results",
                            results, "--figures", W / "f-seeds", "--experiments",
                            TREE / "experiments", "--seeds", seeds])
        record(s, f"--seeds {seeds}", rc, out, err, refused(rc, err, says) and no_reports(results, "mini"))
    # The valid archives still rebuild, and say whether a sidecar was checked.
    for name in ["mini", "mini-powered"]:
        results = W / f"r-ok-{name}"
        rc, out, err = run(["reproduce", "all", "--scale", "mini", "--from", TREE / f"results/{name}.tar.gz",
                            "--results", results, "--figures", W / "f-ok", "--experiments",
                            TREE / "experiments"])
        record(s, f"shipped {name}.tar.gz rebuilds, sidecar named", rc, out, err,
               rc == 0 and f"{name}.tar.gz.sha256" in out and (results / f"from-{name}/seeds.md").exists())
    shutil.copy(TREE / "results/mini.tar.gz", W / "nosidecar.tar.gz")
    rc, out, err = run(["verify", W / "nosidecar.tar.gz"])
    record(s, "verify without a .sha256 says so", rc, out, err, rc == 0 and "not checked" in out)
    # A report failing half-way (tail histograms not JSON) writes nothing of its set.
    def t(root):
        for r in runs(root, "mini-xs-grpo-ac-"):
            (r / "tails/step_000003.json").write_text("not json")
        return None
    tamper_case(s, "a report failing half-way leaves no part of its set", mini, t,
                ["step_000003.json"], stem="halfway")


# ---------------------------------------------------------------------------------------------
# sweep --from: the shipped study archive, tampered with and resealed.

def sweep_from():
    s = "sweep --from"
    study = TREE / "results/study.tar.gz"
    cases = [
        ("a run removed", lambda r: shutil.rmtree(r), "not there"),
        ("metrics.jsonl emptied", lambda r: (r / "metrics.jsonl").write_text(""), "metrics.jsonl"),
        ("metrics.jsonl's last line removed", lambda r: cut(lambda l: l[:-1])(r, "metrics.jsonl"), "metrics.jsonl"),
        ("eval.jsonl emptied", lambda r: (r / "eval.jsonl").write_text(""), "eval.jsonl"),
        ("eval.jsonl removed", lambda r: (r / "eval.jsonl").unlink(), "eval.jsonl"),
        ("eval.jsonl's last line removed", lambda r: cut(lambda l: l[:-1])(r, "eval.jsonl"), "eval.jsonl"),
    ]
    for what, edit, says in cases:
        for prefix in ["study-grpo-ac-p3-", "study-grpo-cispo-p1-"]:
            root = unpacked(study, "st")
            r = runs(root, prefix)[0]
            edit(r)
            reseal(root)
            pack(root, W / "study-t.tar.gz")
            results = W / "r-sweep"
            shutil.rmtree(results, ignore_errors=True)
            rc, out, err = run(["sweep", *sorted(str(p) for p in (TREE / "sweeps").glob("study-*.yaml")),
                                "--compare", "study", "--from", W / "study-t.tar.gz", "--results", results,
                                "--figures", W / "f-sweep"])
            written = (results / "from-study-t/sweeps/study.md").exists()
            record(s, f"{what} ({prefix[:-1]})", rc, out, err, refused(rc, err, says) and not written)


# ---------------------------------------------------------------------------------------------
# acpo doc.

BLANK = "# T\n\n<!-- begin: t.md -->\nold\n<!-- end: t.md -->\n"
FILLED = "# T\n\n<!-- begin: t.md -->\n| a |\n<!-- end: t.md -->\n"


def doc():
    s = "doc"
    d = W / "doc"
    gen = d / "gen"
    gen.mkdir(parents=True)
    (gen / "t.md").write_text("| a |\n")
    # Links, modes and owners.
    for mode in [0o600, 0o640, 0o644, 0o444, 0o755]:
        for linked in [False, True]:
            real = d / f"real-{mode:o}-{linked}.md"
            real.write_text(BLANK)
            os.chmod(real, mode)
            if os.geteuid() == 0:
                os.chown(real, 4242, 4343)
            target = real
            if linked:
                target = d / f"link-{mode:o}.md"
                target.symlink_to(real)
            rc, out, err = run(["doc", target, "--from", gen])
            st = os.stat(real)
            held = (rc == 0 and real.read_text() == FILLED and stat.S_IMODE(st.st_mode) == mode
                    and (not linked or target.is_symlink())
                    and (os.geteuid() != 0 or (st.st_uid, st.st_gid) == (4242, 4343)))
            record(s, f"{'a link to ' if linked else ''}a {mode:o} document", rc, out, err, held)
            rc, out, err = run(["doc", target, "--from", gen, "--check"])
            record(s, f"  --check after it ({mode:o}, link {linked})", rc, out, err, rc == 0)
    # Generated text holding a marker.
    for body in ["x\n<!-- end: t.md -->\n", "<!-- begin: t.md -->\n", "a <!-- begin: u.md --> b\n",
                 "<!-- end: u.md -->", "| a |\n<!-- end: t.md -->\n<!-- begin: t.md -->\n"]:
        g = d / "gen-marker"
        g.mkdir(exist_ok=True)
        (g / "t.md").write_text(body)
        doc_path = d / "m.md"
        doc_path.write_text(BLANK)
        for check in [[], ["--check"]]:
            rc, out, err = run(["doc", doc_path, "--from", g, *check])
            record(s, f"generated text {body!r} {' '.join(check)}", rc, out, err,
                   refused(rc, err, "t.md", "block marker") and doc_path.read_text() == BLANK)
    # Several documents: all or none.
    bad_docs = {
        "an unclosed block": "<!-- begin: t.md -->\nno end\n",
        "a block outside the folder": "<!-- begin: ../t.md -->\n<!-- end: ../t.md -->\n",
        "no block the folder fills": "<!-- begin: zz.md -->\n<!-- end: zz.md -->\n",
    }
    for what, text in bad_docs.items():
        for order in ["A B", "B A"]:
            a, b = d / "A.md", d / "B.md"
            a.write_text(BLANK)
            b.write_text(text)
            args = [a, b] if order == "A B" else [b, a]
            rc, out, err = run(["doc", *args, "--from", gen])
            record(s, f"doc {order}, B with {what}", rc, out, err,
                   refused(rc, err, "B.md") and a.read_text() == BLANK and not (d / "A.md.tmp").exists())
    a, b = d / "A.md", d / "B.md"
    a.write_text(BLANK)
    b.write_text(BLANK)
    # The writer's temporaries are new files under names of its own (issue #58): what squats on
    # the name they used to have is neither used nor removed.
    (d / "B.md.tmp").mkdir()
    (d / "B.md.tmp/keep").write_text("x")
    rc, out, err = run(["doc", a, b, "--from", gen])
    record(s, "doc A B, a folder squatting on B.md.tmp", rc, out, err,
           rc == 0 and a.read_text() == FILLED and b.read_text() == FILLED
           and (d / "B.md.tmp/keep").read_text() == "x")
    shutil.rmtree(d / "B.md.tmp")
    a.write_text(BLANK)
    b.write_text(BLANK)
    rc, out, err = run(["doc", a, b, a, "--from", gen])
    record(s, "doc A B A: both filled, no temporary left", rc, out, err,
           rc == 0 and a.read_text() == FILLED and b.read_text() == FILLED
           and not list(d.glob("*.tmp")))
    dangling = d / "dangling.md"
    dangling.symlink_to(d / "nowhere.md")
    rc, out, err = run(["doc", a, dangling, "--from", gen])
    record(s, "doc A LINK, the link dangling", rc, out, err,
           refused(rc, err, "dangling.md") and not (d / "nowhere.md").exists())
    rc, out, err = run(["doc", "docs/CUDA.md", "REPRODUCE.md", "--from",
                        sorted((TREE / "results/gpu").iterdir())[0], "--check"])
    record(s, "the CI's doc --check stays green", rc, out, err, rc == 0)


# ---------------------------------------------------------------------------------------------
# import verl: a 20-step log, dumps at 0, 10, 20, against a manifest evaluating every 10 steps.

def import_verl():
    s = "import verl"
    manifest = TREE / "experiments/paper/qwen3-1.7b-grpo.yaml"
    logs = W / "verl"
    val = logs / "validation"
    val.mkdir(parents=True)
    lines = [json.dumps({"step": 0, "data": {}})]
    for step in range(1, 21):
        lines.append(json.dumps({"step": step, "data": {"actor/pg_loss": 0.1, "critic/score/mean": 0.5}}))
    (logs / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    benches = ["math500", "minerva", "olympiadbench", "aime-like"]
    k = 16  # the manifest's eval.k
    def dump(step):
        out = []
        for b in benches:
            for p in range(2):
                for _ in range(k):
                    out.append(json.dumps({"input": "q", "output": "\\boxed{3}", "gts": "3", "score": 1.0,
                                           "step": step, "data_source": b, "problem_id": f"{b}/{p}"}))
        return "\n".join(out) + "\n"
    for step in [0, 10, 20]:
        (val / f"{step}.jsonl").write_text(dump(step))
    cases = [("05.jsonl", "name"), ("+10.jsonl", "name"), ("010.jsonl", "name"), ("0010.jsonl", "name"),
             ("00.jsonl", "name"), ("1e1.jsonl", "name"), ("10.0.jsonl", "name"), (" 10.jsonl", "name"),
             ("-10.jsonl", "name"), ("ten.jsonl", "name"), ("99999999999999999999999.jsonl", "name"),
             ("999.jsonl", "after the last step"), ("30.jsonl", "after the last step"),
             ("18446744073709551615.jsonl", "after the last step"), ("100.jsonl", "after the last step"),
             ("5.jsonl", "does not evaluate at"), ("15.jsonl", "does not evaluate at"),
             ("1.jsonl", "does not evaluate at"), ("19.jsonl", "does not evaluate at")]
    for name, says in cases:
        extra = val / name
        extra.write_text(dump(10))
        out_dir = W / "verl-out"
        rc, out, err = run(["import", "verl", "--manifest", manifest, "--metrics", logs / "metrics.jsonl",
                            "--validation-dir", val, "--out", out_dir])
        record(s, f"a dump named {name!r}", rc, out, err,
               refused(rc, err, name.strip(), says) and not out_dir.exists())
        extra.unlink()
        shutil.rmtree(out_dir, ignore_errors=True)
    rc, out, err = run(["import", "verl", "--manifest", manifest, "--metrics", logs / "metrics.jsonl",
                        "--validation-dir", val, "--out", W / "verl-ok"])
    record(s, "the dumps as verl writes them import", rc, out, err, rc == 0 and "3 evaluations" in out)


# ---------------------------------------------------------------------------------------------
# Numeric flags: found from each command's help (a flag whose value `abc` is refused and that
# lists no possible values), each given 0, a huge value, -1, inf and NaN.

ZERO_OK = {"seed", "step", "vocab-chunk", "temperature"}
HUGE_OK = {"seed", "temperature"}


def commands():
    def subs(path):
        rc, out, err = run([*path, "--help"])
        names = []
        section = False
        for line in out.splitlines():
            if line.startswith("Commands:"):
                section = True
                continue
            if section:
                m = re.match(r"^  ([a-z][a-z0-9-]*)\s", line)
                if m and m.group(1) != "help":
                    names.append(m.group(1))
                elif not line.startswith("  "):
                    section = False
        if not names:
            return [path]
        return [c for n in names for c in subs([*path, n])]
    return subs([])


def numeric_flags(path):
    rc, out, err = run([*path, "--help"])
    flags = []
    for m in re.finditer(r"--([a-z][a-z0-9-]*) <[A-Z_]+>", out):
        flag = m.group(1)
        block = re.split(r"\n +-", out[m.end():], maxsplit=1)[0]  # its help, to the next flag
        if "possible values" in block.lower():
            continue
        rc, o, e = run([*path, f"--{flag}", "abc"])
        if f"invalid value 'abc' for '--{flag}" in e and flag not in flags:
            flags.append(flag)
    return flags


def flags():
    s = "numeric flags"
    for path in commands():
        for flag in numeric_flags(path):
            float_flag = flag in ("temperature", "top-p")
            huge = "1e308" if float_flag else "18446744073709551615"
            for value, must_refuse in [("0", flag not in ZERO_OK), (huge, flag not in HUGE_OK),
                                       ("-1", True), ("inf", True), ("NaN", True)]:
                rc, out, err = run([*path, f"--{flag}", value], cwd=W)
                named = f"invalid value '{value}' for '--{flag}"
                held = refused(rc, err, named) if must_refuse else named not in err
                record(s, f"acpo {' '.join(path)} --{flag} {value}", rc, out, err, held)
    manifest = TREE / "experiments/paper/qwen3-1.7b-grpo.yaml"
    for mb in ["3", "1000000", "8"]:
        rc, out, err = run(["pipeline", manifest, "--micro-batch", mb, "--results", W / "p",
                            "--models", W / "pm"])
        record(s, f"pipeline --micro-batch {mb} (4 responses per mini-batch)", rc, out, err,
               refused(rc, err, f"--micro-batch {mb} does not divide") and not (W / "p").exists())


def main():
    print("surface | case | exit | held | said")
    for probe in [reproduce_from, sweep_from, doc, import_verl, flags]:
        probe()
    print("\nsurface | tried | held")
    for surface, (tried, held) in TALLY.items():
        print(f"{surface} | {tried} | {held}")
    total = [sum(t[i] for t in TALLY.values()) for i in (0, 1)]
    print(f"all | {total[0]} | {total[1]}")
    shutil.rmtree(W, ignore_errors=True)


if __name__ == "__main__":
    main()
