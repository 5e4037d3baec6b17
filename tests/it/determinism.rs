//! Issue #48's guard: a run's numbers depend on its manifest only, not on the number of threads,
//! and they are the shipped archive's. Two mini runs (xs PPO-AC and xs GRPO, whose critic and
//! group sampling cover both families' paths) are trained for a few steps on one thread and on
//! several, and what they write is compared with what the same steps wrote in
//! `results/mini.tar.gz`: the metrics lines less their timings, the r·Â tails, and the step-0
//! evaluation of the first problems of each benchmark (the evaluation samples them in the same
//! batch of 64 as the full run did). A change that moves the numbers fails here until the
//! archives are regenerated on purpose and REPRODUCE.md's "Changes to the numbers" names the
//! new archive's digests.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;

use acpo::data::{synthetic, Benchmark};
use acpo::manifest::Experiment;
use acpo::train::{TrainOptions, Trainer};
use serde_json::{json, Value};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The archive the guarded runs come from.
const ARCHIVE: &str = "results/mini.tar.gz";

/// (manifest under experiments/mini, its seed-1 run directory in [`ARCHIVE`]).
const GUARDED: [(&str, &str); 2] = [
    ("mini-xs-ppo-ac", "mini-xs-ppo-ac-71f53af6b778"),
    ("mini-xs-grpo", "mini-xs-grpo-9e6c0b28efb6"),
];

/// Training steps compared: GRPO's third writes tails (tails_every: 3).
const STEPS: usize = 3;

/// Problems of each benchmark evaluated at step 0: one batch of the evaluation's 64 sequences
/// per call, so the run samples them exactly as the archived run did.
const EVAL_PROBLEMS: usize = 64;

/// Thread counts each guarded run is trained with: one, and more than this 2-core project's
/// machines have, so micro-batches run side by side and the ops split.
const THREADS: [usize; 2] = [1, 4];

const BENCHMARKS: [Benchmark; 4] = [
    Benchmark::Math500,
    Benchmark::Minerva,
    Benchmark::Olympiadbench,
    Benchmark::AimeLike,
];

/// What a run of [`STEPS`] steps shares with the full run: its metrics lines without timing
/// keys, its tails files up to that step, and the step-0 pass rates of each benchmark's first
/// [`EVAL_PROBLEMS`] problems. `files` maps a run-relative path to its text.
fn record(files: &BTreeMap<String, String>) -> Value {
    let metrics: Vec<Value> = files["metrics.jsonl"]
        .lines()
        .take(STEPS)
        .map(|l| {
            let Value::Object(m) = serde_json::from_str(l).expect("metrics line") else {
                panic!("a metrics line is an object");
            };
            Value::Object(
                m.into_iter()
                    .filter(|(k, _)| !k.starts_with("timing_s/") && !k.starts_with("perf/"))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(metrics.len(), STEPS, "metrics.jsonl has {STEPS} steps");
    let eval0: Value = serde_json::from_str(
        files["eval.jsonl"]
            .lines()
            .next()
            .expect("eval.jsonl has the step-0 line"),
    )
    .expect("eval line");
    assert_eq!(eval0["step"], 0);
    let mut pass_rates = BTreeMap::new();
    for (b, bench) in BENCHMARKS
        .iter()
        .zip(eval0["benchmarks"].as_array().expect("benchmarks"))
    {
        assert_eq!(bench["benchmark"], b.name());
        let rates = &bench["pass_rates"];
        let first: BTreeMap<String, Value> = synthetic::benchmark(*b)
            .into_iter()
            .take(EVAL_PROBLEMS)
            .map(|p| {
                let rate = rates[&p.id].clone();
                assert!(rate.is_number(), "{}: no pass rate for {}", b.name(), p.id);
                (p.id, rate)
            })
            .collect();
        pass_rates.insert(b.name().to_string(), first);
    }
    let tails: BTreeMap<&String, Value> = files
        .iter()
        .filter(|(name, _)| tails_step(name).is_some_and(|s| s <= STEPS))
        .map(|(name, text)| (name, serde_json::from_str(text).expect("tails json")))
        .collect();
    json!({ "metrics": metrics, "eval_step0_pass_rates": pass_rates, "tails": tails })
}

/// The step of `tails/step_NNNNNN.json`.
fn tails_step(name: &str) -> Option<usize> {
    name.strip_prefix("tails/step_")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

fn digest(record: &Value) -> String {
    acpo::checksum::hex(&<sha2::Sha256 as sha2::Digest>::digest(
        record.to_string().as_bytes(),
    ))
}

/// The text files of run directory `run` inside the gzipped tar `archive`.
fn archived_files(archive: &Path, run: &str) -> BTreeMap<String, String> {
    let file = std::fs::File::open(archive).expect("the shipped archive");
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(file));
    let prefix = format!("{run}/");
    let mut out = BTreeMap::new();
    for entry in tar.entries().expect("tar") {
        let mut entry = entry.expect("tar entry");
        let path = entry.path().expect("path").to_string_lossy().into_owned();
        if let Some(rel) = path.strip_prefix(&prefix) {
            if entry.header().entry_type().is_file() && !rel.starts_with("checkpoints/") {
                let mut text = String::new();
                entry.read_to_string(&mut text).expect("utf-8 text");
                out.insert(rel.to_string(), text);
            }
        }
    }
    assert!(
        out.contains_key("metrics.jsonl"),
        "{}: no run {run}",
        archive.display()
    );
    out
}

/// The text files a run directory holds (its checkpoints aside).
fn run_files(dir: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for name in ["metrics.jsonl", "eval.jsonl"] {
        out.insert(
            name.to_string(),
            std::fs::read_to_string(dir.join(name)).expect("run file"),
        );
    }
    if let Ok(tails) = std::fs::read_dir(dir.join("tails")) {
        for e in tails {
            let e = e.expect("entry");
            let name = format!("tails/{}", e.file_name().to_string_lossy());
            out.insert(name, std::fs::read_to_string(e.path()).expect("tails"));
        }
    }
    out
}

/// Trains `manifest` (its model copied into `ws`, its evaluation limited to the first
/// [`EVAL_PROBLEMS`] problems) for [`STEPS`] steps inside a rayon pool of `threads`, which is
/// what every parallel op and the micro-batches side by side ask the size of.
fn train_briefly(ws: &Path, manifest: &str, threads: usize) -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo().join(format!("experiments/mini/{manifest}.yaml")))
        .expect("manifest");
    let model = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("dir: "))
        .expect("model.dir")
        .to_string();
    let copy = ws.join(&model);
    if !copy.exists() {
        std::fs::create_dir_all(&copy).expect("model dir");
        for f in std::fs::read_dir(repo().join(&model)).expect("shipped model") {
            let f = f.expect("entry");
            std::fs::copy(f.path(), copy.join(f.file_name())).expect("copy model");
        }
    }
    let config = "config: experiments/mini/";
    let text = text
        .replace(
            &format!("dir: {model}"),
            &format!("dir: {}", copy.display()),
        )
        .replace(
            config,
            &format!("config: {}/experiments/mini/", repo().display()),
        )
        .replace("\neval:\n", &format!("\neval:\n  limit: {EVAL_PROBLEMS}\n"));
    let exp = Experiment::from_yaml(&text, Path::new(&format!("{manifest}.yaml")))
        .expect("valid manifest");
    let out = ws.join(format!("threads-{threads}"));
    let opts = TrainOptions {
        out_root: out.clone(),
        resume: false,
        max_steps: Some(STEPS),
        // The mini scale trains and evaluates on the synthetic task: no data directory is read.
        data: acpo::data::DataLocation::Dir(out.join("no-data-needed")),
        hub: acpo::hub::HubOptions {
            cache_dir: out.join("hub"),
            offline: true,
        },
        start_evals: None,
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let dir = pool.install(|| {
        let mut trainer = Trainer::new(&exp, &text, &opts).expect("trainer");
        trainer.run(&opts, &mut |_| {}).expect("train").dir
    });
    run_files(&dir)
}

/// The first place two records differ, for the failure message.
fn first_difference(a: &Value, b: &Value, at: &str) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| match (x.get(k), y.get(k)) {
                (Some(p), Some(q)) => first_difference(p, q, &format!("{at}/{k}")),
                (p, q) => Some(format!("{at}/{k}: {p:?} against {q:?}")),
            })
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (p, q))| first_difference(p, q, &format!("{at}[{i}]"))),
        _ => (a != b).then(|| format!("{at}: {a} against {b}")),
    }
}

#[test]
fn a_run_is_byte_identical_on_any_thread_count_and_equals_the_shipped_archive() {
    let ws = tempfile::tempdir().expect("tmp");
    let mut unnamed = Vec::new();
    let reproduce = std::fs::read_to_string(repo().join("REPRODUCE.md")).expect("REPRODUCE.md");
    for (manifest, run) in GUARDED {
        let shipped = record(&archived_files(&repo().join(ARCHIVE), run));
        for threads in THREADS {
            let trained = record(&train_briefly(ws.path(), manifest, threads));
            if let Some(diff) = first_difference(&trained, &shipped, manifest) {
                panic!(
                    "{manifest} on {threads} thread(s) differs from {ARCHIVE}'s {run} in its \
                     first {STEPS} steps: {diff}"
                );
            }
        }
        let d = digest(&shipped);
        if !reproduce.contains(&d[..16]) {
            unnamed.push(format!("{run} {d}"));
        }
    }
    assert!(
        unnamed.is_empty(),
        "REPRODUCE.md's \"Changes to the numbers\" does not name the guard digests of \
         {ARCHIVE}'s runs ({}): when the archives are regenerated on purpose, say there what \
         changed and name the new digests",
        unnamed.join(", ")
    );
}
