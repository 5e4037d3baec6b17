//! Benchmarks, the Avg@k evaluator, and the `score` / `eval` commands.

use std::path::Path;
use std::process::Command;

use acpo::data::Benchmark;
use acpo::data::{self, DataError, DataLocation};
use acpo::eval::{bench_result, maj_at_k, majority_vote, pass_at, summarize, SampleRecord};
use acpo::hub::HubOptions;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn acpo(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(args)
        .current_dir(repo())
        .output()
        .expect("acpo runs")
}

fn binom(n: usize, k: usize) -> f64 {
    if k > n {
        return 0.0;
    }
    (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
}

#[test]
fn unbiased_pass_at_k_matches_the_binomial_formula() {
    for n in 1..=16 {
        for c in 0..=n {
            for k in 1..=n {
                let want = 1.0 - binom(n - c, k) / binom(n, k);
                assert!((pass_at(n, c, k) - want).abs() < 1e-12, "n={n} c={c} k={k}");
            }
        }
    }
}

#[test]
fn weighted_accuracy_reproduces_the_papers_weighted_column() {
    // The paper's per-benchmark Avg@k (paper/table1.csv); weighting them by the problem
    // counts must give its weighted column. Inputs rounded to 0.1 move the weighted mean by at
    // most 0.05, and the reported value is rounded too: at most 0.1 apart.
    let table = acpo::report::PAPER_TABLE1;
    let mut rows = 0;
    for line in table.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        let reported: f64 = f[3].parse().expect("weighted");
        let results: Vec<_> = Benchmark::ALL
            .iter()
            .zip(&f[4..8])
            .map(|(b, acc)| {
                let acc: f64 = acc.parse::<f64>().expect("acc") / 100.0;
                let mut r = bench_result(b.name(), &[], &[]);
                r.problems = b.size();
                r.avg_at_k = acc;
                r.k = 16;
                r
            })
            .collect();
        let s = summarize(0, results);
        assert!(
            (100.0 * s.weighted_accuracy - reported).abs() <= 0.1 + 1e-9,
            "{line}: {}",
            100.0 * s.weighted_accuracy
        );
        assert!(s.metrics.contains_key("val-core/weighted/acc/mean@16"));
        rows += 1;
    }
    assert_eq!(rows, 16);
}

#[test]
fn avg_at_k_pass_rates_and_metric_names() {
    let ids: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
    let correct = vec![
        vec![true, true, false, false],
        vec![false; 4],
        vec![true; 4],
    ];
    let r = bench_result("math500", &ids, &correct);
    assert_eq!(r.k, 4);
    assert!((r.avg_at_k - 0.5).abs() < 1e-12);
    assert_eq!(r.pass_rates["a"], 0.5);
    assert_eq!(r.pass_rates["b"], 0.0);
    assert!((r.pass_at[&1] - 0.5).abs() < 1e-12 && (r.pass_at[&4] - 2.0 / 3.0).abs() < 1e-12);
    let s = summarize(7, vec![r]);
    assert_eq!(s.step, 7);
    assert!((s.metrics["val-core/math500/acc/mean@4"] - 0.5).abs() < 1e-12);
    assert!((s.metrics["val-aux/math500/acc/pass@4"] - 2.0 / 3.0).abs() < 1e-12);
}

/// A judged sample of problem `p` with answer `a`, correct when `ok`.
fn sample(p: &str, i: usize, a: Option<&str>, ok: bool) -> SampleRecord {
    SampleRecord {
        benchmark: "math500".into(),
        problem_id: p.into(),
        sample_index: i,
        response: String::new(),
        extracted: a.map(String::from),
        correct: ok,
        error: None,
        finish_reason: acpo::rollout::FinishReason::Eos,
        num_tokens: 1,
    }
}

/// The vote has two homes, this crate's and the Python package's `acpo.majority_vote`
/// (python/tests/test_majority.py reads the same cases): they must agree.
#[test]
fn majority_vote_agrees_with_the_python_packages_cases() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("python/tests/fixtures/majority.json");
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("the fixture")).expect("json");
    let cases = fixture["cases"].as_array().expect("cases");
    assert!(cases.len() >= 10);
    for case in cases {
        let answers: Vec<Option<&str>> = case["answers"]
            .as_array()
            .expect("answers")
            .iter()
            .map(|a| a.as_str())
            .collect();
        let winner = case["winner"].as_u64().map(|w| w as usize);
        assert_eq!(majority_vote(answers.iter().copied()), winner, "{case}");
    }
}

#[test]
fn maj_at_k_votes_on_extracted_answers_with_the_first_seen_winning_ties() {
    // the most frequent answer wins; a sample with no answer does not vote
    assert_eq!(
        majority_vote([Some("3"), None, Some("4"), Some("4"), None, None]),
        Some(2)
    );
    // a tie goes to the answer seen first, as verl's calc_maj_val and lighteval's MajAtK pick
    assert_eq!(
        majority_vote([Some("4"), Some("3"), Some("3"), Some("4")]),
        Some(0)
    );
    assert_eq!(majority_vote([Some("b"), Some("a")]), Some(0));
    // equal strings vote together, equivalent ones do not (1/2 and 0.5 are two answers)
    assert_eq!(
        majority_vote([Some("1/2"), Some("0.5"), Some("7"), Some("7")]),
        Some(2)
    );
    assert_eq!(majority_vote([None, None]), None);
    assert_eq!(majority_vote(std::iter::empty()), None);
    let records = vec![
        // a: 2 right of 4, but the wrong answer 5 has 2 votes and comes first: wrong
        sample("a", 0, Some("5"), false),
        sample("a", 1, Some("6"), true),
        sample("a", 2, Some("5"), false),
        sample("a", 3, Some("6"), true),
        // b: one right answer among samples with none: right
        sample("b", 0, None, false),
        sample("b", 1, Some("2"), true),
        sample("b", 2, None, false),
        sample("b", 3, None, false),
        // c: no answer at all: wrong; d: the majority is right (given out of order)
        sample("c", 0, None, false),
        sample("c", 1, None, false),
        sample("c", 2, None, false),
        sample("c", 3, None, false),
        sample("d", 3, Some("9"), true),
        sample("d", 0, Some("8"), false),
        sample("d", 2, Some("9"), true),
        sample("d", 1, Some("9"), true),
    ];
    let maj = maj_at_k(&records);
    assert_eq!(maj.len(), 1);
    assert!((maj["math500"] - 0.5).abs() < 1e-12, "{maj:?}");
    // in the summary: per benchmark, verl's metric names, and weighted by problems
    let ids: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
    let correct = vec![
        vec![false, true, false, true],
        vec![false, true, false, false],
        vec![false; 4],
        vec![false, true, true, true],
    ];
    let plain = summarize(3, vec![bench_result("math500", &ids, &correct)]);
    assert_eq!(plain.benchmarks[0].maj_at_k, None);
    // training's eval.jsonl lines (no maj@k) are written as before
    let line = serde_json::to_string(&plain).expect("json");
    assert!(!line.contains("maj"), "{line}");
    let s = plain.with_majority(&records);
    assert_eq!(s.benchmarks[0].maj_at_k, Some(0.5));
    assert!((s.metrics["val-core/math500/acc/maj@4/mean"] - 0.5).abs() < 1e-12);
    assert!((s.metrics["val-core/weighted/acc/maj@4/mean"] - 0.5).abs() < 1e-12);
    assert!(s.describe().contains("maj@4  50.00 %"), "{}", s.describe());
}

#[test]
fn the_real_benchmarks_load_with_their_checksums_and_a_changed_file_is_refused() {
    let Some(data_dir) = super::real_data(
        "the_real_benchmarks_load_with_their_checksums_and_a_changed_file_is_refused",
    ) else {
        return;
    };
    let dir = DataLocation::Dir(data_dir.clone());
    for b in Benchmark::ALL {
        let problems = data::load(data::spec(b), &dir).expect("loads");
        assert_eq!(problems.len(), b.size(), "{}", b.name());
    }
    assert_eq!(
        data::load(&data::dapo::SPEC, &dir).expect("dapo").len(),
        17_290
    );
    let tmp = tempfile::tempdir().expect("tmp");
    let mut text = std::fs::read_to_string(data_dir.join("math500.jsonl")).expect("read");
    text = text.replacen("\"answer\": \"", "\"answer\": \"9", 1);
    std::fs::write(tmp.path().join("math500.jsonl"), text).expect("write");
    let err = data::load(
        data::spec(Benchmark::Math500),
        &DataLocation::Dir(tmp.path().to_owned()),
    )
    .expect_err("changed");
    assert!(matches!(err, DataError::Checksum { .. }), "{err}");
    assert!(err.to_string().contains("math500.jsonl"), "{err}");
}

/// A fake hub cache: `datasets--owner--name/refs/main` + `snapshots/<hash>/<file>`.
fn cache_file(cache: &Path, repo: &str, file: &str, bytes: &[u8]) {
    let commit = "fedcba9876543210fedcba9876543210fedcba98";
    let root = cache.join(format!("datasets--{}", repo.replace('/', "--")));
    let path = root.join("snapshots").join(commit).join(file);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    std::fs::create_dir_all(root.join("refs")).expect("mkdir");
    std::fs::write(root.join("refs/main"), commit).expect("ref");
    std::fs::write(path, bytes).expect("write");
}

#[test]
fn hub_datasets_load_from_the_offline_cache_jsonl_and_parquet() {
    let Some(data_dir) =
        super::real_data("hub_datasets_load_from_the_offline_cache_jsonl_and_parquet")
    else {
        return;
    };
    let cache = tempfile::tempdir().expect("tmp");
    // MATH-500 on the hub names its id field `unique_id`.
    let ours = std::fs::read_to_string(data_dir.join("math500.jsonl")).expect("read");
    let hub_jsonl: String = ours
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).expect("json");
            let id = v["id"].clone();
            v.as_object_mut()
                .expect("obj")
                .insert("unique_id".into(), id);
            v.as_object_mut().expect("obj").remove("id");
            v.to_string() + "\n"
        })
        .collect();
    cache_file(
        cache.path(),
        "HuggingFaceH4/MATH-500",
        "test.jsonl",
        hub_jsonl.as_bytes(),
    );
    // The hub's parquet schema for 4 problems (tools/generators/make_hub_fixture.py writes it).
    let parquet = std::fs::read(repo().join("tests/fixtures/hub/dapo-math-17k-tiny.parquet"))
        .expect("fixture");
    cache_file(
        cache.path(),
        "BytedTsinghua-SIA/DAPO-Math-17k",
        "data/dapo-math-17k.parquet",
        &parquet,
    );
    let hub = DataLocation::Hub(HubOptions {
        cache_dir: cache.path().to_owned(),
        offline: true,
    });

    let local = data::load(
        data::spec(Benchmark::Math500),
        &DataLocation::Dir(data_dir.clone()),
    )
    .expect("local");
    assert_eq!(
        data::load(data::spec(Benchmark::Math500), &hub).expect("hub math500"),
        local
    );

    let dapo = data::load(&data::dapo::SPEC, &hub).expect("hub dapo");
    let got: Vec<(&str, &str)> = dapo
        .iter()
        .map(|p| (p.problem.as_str(), p.answer.as_str()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("What is $1+1$?", "2"),
            (
                "Compute $\\frac{6}{4}$ in lowest terms as a+b for a/b.",
                "5"
            ),
            ("Find $x$ if $2x=10$.", "5"),
        ],
        "template stripped, 3x repetition and the exact duplicate removed"
    );
    let err = data::load(data::spec(Benchmark::Minerva), &hub).expect_err("no hub copy");
    assert!(matches!(err, DataError::NoHubCopy { .. }), "{err}");
    let empty = DataLocation::Hub(HubOptions {
        cache_dir: tempfile::tempdir().expect("tmp").path().to_owned(),
        offline: true,
    });
    let err = data::load(data::spec(Benchmark::Math500), &empty).expect_err("not cached");
    assert!(err.to_string().contains("offline cache"), "{err}");
}

#[test]
fn a_dataset_missing_from_the_data_dir_without_a_hub_copy_names_the_file_to_put_there() {
    let empty = tempfile::tempdir().expect("tmp");
    let err = data::load(
        data::spec(Benchmark::Minerva),
        &DataLocation::Dir(empty.path().to_owned()),
    )
    .expect_err("missing");
    assert!(matches!(err, DataError::Missing { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("minerva_math.jsonl") && msg.contains("ACPO_DATA_DIR"),
        "{msg}"
    );
}

#[test]
fn score_adds_verdicts_keeps_fields_and_refuses_bad_lines_without_writing() {
    let dir = tempfile::tempdir().expect("tmp");
    let input = dir.path().join("in.jsonl");
    std::fs::write(
        &input,
        concat!(
            r#"{"id": 1, "response": "so \\boxed{\\frac{1}{2}}", "answer": "0.5"}"#,
            "\n",
            r#"{"id": 2, "response": "Answer: 7", "answer": "8"}"#,
            "\n",
            r#"{"id": 3, "response": "no idea", "answer": "3"}"#,
            "\n",
        ),
    )
    .expect("write");
    let output = dir.path().join("out.jsonl");
    let out = acpo(&[
        "score",
        "--input",
        input.to_str().expect("utf8"),
        "--output",
        output.to_str().expect("utf8"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("scored 3 responses: 1 correct"));
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&output)
        .expect("out")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(lines[0]["id"], 1);
    assert_eq!(lines[0]["correct"], true);
    assert_eq!(lines[0]["extracted"], "\\frac{1}{2}");
    assert_eq!(lines[1]["correct"], false);
    assert_eq!(lines[2]["extracted"], serde_json::Value::Null);

    std::fs::write(
        &input,
        "{\"response\": \"\\\\boxed{1}\", \"answer\": \"1\"}\n{\"response\": \"x\"}\n",
    )
    .expect("write");
    let bad_out = dir.path().join("bad.jsonl");
    let out = acpo(&[
        "score",
        "--input",
        input.to_str().expect("utf8"),
        "--output",
        bad_out.to_str().expect("utf8"),
    ]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("in.jsonl:2") && stderr.contains("answer"),
        "{stderr}"
    );
    assert!(
        !bad_out.exists(),
        "nothing is written when the input is bad"
    );
}

#[test]
fn eval_runs_end_to_end_on_a_tiny_model_and_writes_samples_and_summary() {
    let dir = tempfile::tempdir().expect("tmp");
    let Some(model) = super::tiny_full_vocab_model(
        dir.path(),
        "eval_runs_end_to_end_on_a_tiny_model_and_writes_samples_and_summary",
    ) else {
        return;
    };
    let manifest_text =
        std::fs::read_to_string(repo().join("experiments/paper/qwen3-8b-grpo.yaml"))
            .expect("manifest")
            .replace("name: qwen3-8b-grpo", "name: tiny-eval")
            .replace("  k: 16 ", "  k: 2 ")
            .replace("  max_new_tokens: 8196", "  max_new_tokens: 6")
            .replace(
                "  prompt_template: boxed         # ours (paper silent)\n",
                "  prompt_template: boxed\n  limit: 3\n",
            );
    let manifest = dir.path().join("tiny-eval.yaml");
    std::fs::write(&manifest, manifest_text).expect("write");
    let out_dir = dir.path().join("eval");
    let args = [
        "eval",
        manifest.to_str().expect("u"),
        "--model",
        model.to_str().expect("u"),
        "--out",
        out_dir.to_str().expect("u"),
        "--step",
        "5",
    ];
    if !cfg!(feature = "cuda") {
        // The paper manifest asks for CUDA: a CPU-only binary says so, and writes nothing.
        let refused = acpo(&args);
        assert_eq!(refused.status.code(), Some(2));
        let err = String::from_utf8_lossy(&refused.stderr);
        assert!(
            err.contains("device cuda") && err.contains("without CUDA"),
            "{err}"
        );
        assert!(!out_dir.exists());
    }
    let out = acpo(&[&args[..], &["--device", "cpu"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let summary: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out_dir.join("summary.json")).expect("summary"),
    )
    .expect("json");
    assert_eq!(summary["step"], 5);
    assert_eq!(summary["benchmarks"].as_array().expect("b").len(), 4);
    let w = summary["weighted_accuracy"].as_f64().expect("w");
    assert!((0.0..=1.0).contains(&w));
    assert!(summary["metrics"]["val-core/aime-like/acc/mean@2"].is_number());
    let maj = summary["benchmarks"][0]["maj_at_k"]
        .as_f64()
        .expect("maj@k");
    assert!((0.0..=1.0).contains(&maj));
    assert_eq!(summary["metrics"]["val-core/math500/acc/maj@2/mean"], maj);
    assert!(summary["metrics"]["val-core/weighted/acc/maj@2/mean"].is_number());
    assert!(String::from_utf8_lossy(&out.stdout).contains("maj@2"));
    let samples = std::fs::read_to_string(out_dir.join("samples.jsonl")).expect("samples");
    assert_eq!(samples.lines().count(), 4 * 3 * 2);
    let first: serde_json::Value =
        serde_json::from_str(samples.lines().next().expect("line")).expect("json");
    assert_eq!(first["benchmark"], "math500");
    assert!(first["num_tokens"].as_u64().expect("n") <= 6);
    // Over the paged KV cache (a problem's k samples sharing its prompt's prefill and blocks):
    // on the CPU the same samples and summary, byte for byte.
    let paged_dir = dir.path().join("eval-paged");
    let mut paged_args = args.to_vec();
    paged_args[5] = paged_dir.to_str().expect("u");
    let paged = acpo(&[&paged_args[..], &["--device", "cpu", "--paged-kv"]].concat());
    assert!(
        paged.status.success(),
        "{}",
        String::from_utf8_lossy(&paged.stderr)
    );
    for file in ["samples.jsonl", "summary.json"] {
        let read = |d: &Path| std::fs::read(d.join(file)).expect("read");
        assert!(
            read(&out_dir) == read(&paged_dir),
            "{file}: the paged cache's differs"
        );
    }
}

/// The paper plan's prompt lengths (`acpo::perf::plan::{TRAIN_PROMPT_TOKENS,
/// EVAL_PROMPT_TOKENS}`) are the data's: the mean prompt, in tokens, of DAPO-Math-17k under
/// qwen3-1.7b-grpo's training template and of its evaluation benchmarks under its evaluation
/// template (each problem once; Avg@k samples every problem k times alike), both through Qwen3's
/// chat template and tokenizer, encoded as training and evaluation encode them.
#[test]
fn the_plan_s_prompt_lengths_are_the_data_s() {
    let test = "the_plan_s_prompt_lengths_are_the_data_s";
    let (Some(data_dir), Some(tok_dir)) = (super::real_data(test), super::qwen3_tokenizer(test))
    else {
        return;
    };
    let exp =
        acpo::manifest::Experiment::load(&repo().join("experiments/paper/qwen3-1.7b-grpo.yaml"))
            .expect("manifest");
    let tok = acpo::model::tokenizer::Tokenizer::load(&tok_dir).expect("tokenizer");
    let dir = DataLocation::Dir(data_dir);
    let mean =
        |spec: &data::DatasetSpec, template: data::PromptTemplate, chat: bool, limit: usize| {
            let problems = data::load(spec, &dir).expect("loads");
            let tokens: usize = problems
                .iter()
                .map(|p| {
                    acpo::eval::encode_prompt(&tok, template, chat, &p.problem)
                        .expect("encodes")
                        .len()
                        .min(limit)
                })
                .sum();
            (tokens, problems.len())
        };
    let train = mean(
        &data::dapo::SPEC,
        exp.data.prompt_template,
        exp.data.apply_chat_template,
        exp.data.max_prompt_length,
    );
    let (mut tokens, mut problems) = (0, 0);
    for &b in &exp.eval.benchmarks {
        let (t, n) = mean(
            data::spec(b),
            exp.eval.prompt_template,
            exp.eval.apply_chat_template,
            usize::MAX,
        );
        tokens += t;
        problems += n;
    }
    let (train, eval) = (
        train.0 as f64 / train.1 as f64,
        tokens as f64 / problems as f64,
    );
    assert_eq!(problems, 1_677);
    assert_eq!(
        acpo::perf::plan::TRAIN_PROMPT_TOKENS,
        train.round(),
        "DAPO-Math-17k's mean prompt is {train:.2} tokens"
    );
    assert_eq!(
        acpo::perf::plan::EVAL_PROMPT_TOKENS,
        eval.round(),
        "the benchmarks' mean prompt is {eval:.2} tokens"
    );
}
