//! Issue #35: generated hostile input to the commands that take a user's files and numbers
//! (`model init`, `model logprobs`, `generate`, `score`). Whatever the input, a command exits 0,
//! 1 or 2 (never a panic's 101 or an abort), within a time limit and a memory bound (its peak
//! resident set, read by `wait4`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The most resident memory one command may reach on any of these inputs.
const MAX_RSS: u64 = 2 << 30;
/// The longest one command may take.
const MAX_TIME: Duration = Duration::from_secs(90);

/// Runs the binary with `args`, returning its exit code; fails the test on a signal, a panic,
/// a timeout or more than [`MAX_RSS`] resident.
// The child is reaped by `wait4`, which also gives its peak resident set (`Child::wait` does not).
#[allow(clippy::zombie_processes)]
fn run(args: &[String], what: &str) -> i32 {
    let mut child = Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("acpo runs");
    let pid = child.id() as libc::pid_t;
    let started = Instant::now();
    let (status, rusage) = loop {
        let mut status = 0;
        // SAFETY: zeroed rusage is a valid out-parameter; wait4 writes it when the child ends.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: the pid is our child's; WNOHANG returns at once while it runs.
        let got = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if got == pid {
            break (status, usage);
        }
        if started.elapsed() > MAX_TIME {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {MAX_TIME:?}: {args:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = {
        use std::io::Read;
        let mut s = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut s);
        }
        s
    };
    let rss = rusage.ru_maxrss as u64 * 1024;
    assert!(
        rss <= MAX_RSS,
        "{what}: {} MiB resident: {args:?}",
        rss >> 20
    );
    assert!(
        libc::WIFEXITED(status),
        "{what}: killed by signal {} ({args:?}): {stderr}",
        libc::WTERMSIG(status)
    );
    let code = libc::WEXITSTATUS(status);
    assert!(
        matches!(code, 0..=2),
        "{what}: exit {code} ({args:?}): {stderr}"
    );
    if code == 2 {
        assert!(
            stderr.starts_with("error: ") && !stderr.contains("panicked"),
            "{what}: not one clear error: {stderr}"
        );
    }
    code
}

/// A deterministic stream of choices (SplitMix64).
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[(self.next() % xs.len() as u64) as usize]
    }
}

fn s(p: &Path) -> String {
    p.to_str().expect("utf8").to_string()
}

/// The values a hostile config field takes.
fn hostile_values() -> Vec<serde_json::Value> {
    use serde_json::json;
    vec![
        json!(0),
        json!(-1),
        json!(1),
        json!(3),
        json!(1_000_000_000u64),
        json!(9_223_372_036_854_775_808u64),
        json!(u64::MAX),
        json!(1e12),
        json!(-1e-6),
        json!(1e308),
        json!(0.5),
        json!("64"),
        json!(null),
        json!(true),
        json!([64, 64]),
        json!({"rope_theta": -5.0, "rope_type": "default"}),
        json!({"rope_type": "yarn", "factor": 4.0}),
    ]
}

fn tiny_config() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen3/config.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("config")).expect("json")
}

/// `model init` on generated configs: one field set to a hostile value (or removed), or the
/// file not JSON at all.
#[test]
fn model_init_survives_hostile_configs() {
    let tmp = tempfile::tempdir().expect("tmp");
    let fields = [
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "rms_norm_eps",
        "rope_parameters",
        "tie_word_embeddings",
        "model_type",
        "initializer_range",
    ];
    let values = hostile_values();
    let ids = tmp.path().join("ids.jsonl");
    std::fs::write(&ids, "{\"ids\": [5, 6, 7, 8]}\n").expect("w");
    let mut draw = Draw(35);
    for case in 0..48 {
        let mut cfg = tiny_config();
        let field = *draw.pick(&fields);
        if case % 7 == 0 {
            cfg.as_object_mut().expect("object").remove(field);
        } else {
            cfg[field] = draw.pick(&values).clone();
        }
        let path = tmp.path().join(format!("c{case}.json"));
        let text = if case % 11 == 5 {
            "{\"hidden_size\": 64, ".to_string() // cut short
        } else {
            cfg.to_string()
        };
        std::fs::write(&path, text).expect("w");
        let out = tmp.path().join(format!("m{case}"));
        let made = run(
            &[
                "model".into(),
                "init".into(),
                "--config".into(),
                s(&path),
                "--out".into(),
                s(&out),
                "--char-tokenizer".into(),
            ],
            &format!("model init, {field}"),
        );
        // what init accepts, the model commands run (zero sizes once panicked there)
        if made == 0 {
            run(
                &[
                    "model".into(),
                    "logprobs".into(),
                    "--model".into(),
                    s(&out),
                    "--input".into(),
                    s(&ids),
                    "--output".into(),
                    s(&tmp.path().join(format!("lp{case}.jsonl"))),
                ],
                &format!("logprobs on the model of {field}"),
            );
        }
    }
}

/// `model logprobs` and `generate` on a tiny model with hostile id files, prompts and flags.
#[test]
fn logprobs_and_generate_survive_hostile_input() {
    let tmp = tempfile::tempdir().expect("tmp");
    let model = tmp.path().join("tiny");
    let cfg = tmp.path().join("tiny.json");
    std::fs::write(&cfg, tiny_config().to_string()).expect("w");
    assert_eq!(
        run(
            &[
                "model".into(),
                "init".into(),
                "--config".into(),
                s(&cfg),
                "--out".into(),
                s(&model),
                "--char-tokenizer".into(),
            ],
            "the tiny model",
        ),
        0
    );
    let long: Vec<u32> = vec![5; 300_000];
    let id_lines = [
        serde_json::json!({"ids": [5, 6, 7]}).to_string(),
        serde_json::json!({"ids": []}).to_string(),
        serde_json::json!({"ids": [5]}).to_string(),
        serde_json::json!({"ids": [5, -1]}).to_string(),
        serde_json::json!({"ids": [5, 1e30]}).to_string(),
        serde_json::json!({"ids": [5, 18446744073709551615u64]}).to_string(),
        serde_json::json!({"ids": [5, "6"]}).to_string(),
        serde_json::json!({"ids": "5 6"}).to_string(),
        serde_json::json!({"tokens": [5, 6]}).to_string(),
        serde_json::json!({"ids": long}).to_string(),
        "{\"ids\": [5, 6".into(),
        "not json".into(),
        "[1, 2, 3]".into(),
    ];
    for (i, line) in id_lines.iter().enumerate() {
        let input = tmp.path().join(format!("ids{i}.jsonl"));
        std::fs::write(&input, format!("{line}\n")).expect("w");
        let code = run(
            &[
                "model".into(),
                "logprobs".into(),
                "--model".into(),
                s(&model),
                "--input".into(),
                s(&input),
                "--output".into(),
                s(&tmp.path().join(format!("lp{i}.jsonl"))),
            ],
            &format!("logprobs, line {i}"),
        );
        assert_eq!(
            code == 0,
            i == 0,
            "only the first line is scored: {line:.80}"
        );
    }
    let prompts = [
        "2 + 2 =".to_string(),
        String::new(),
        "\u{1}\u{7f}".into(),
        "ü∑😀 ﷽".into(),
        "x".repeat(100_000),
        "{\"prompt\": 1}".into(),
    ];
    let flags: [&[&str]; 9] = [
        &[],
        &["--n", "1000000000"],
        &["--max-new-tokens", "1000000000"],
        &["--top-p", "0"],
        &["--top-p", "-1"],
        &["--temperature", "NaN"],
        &["--temperature", "-1"],
        &["--top-k", "0"],
        &["--n", "0"],
    ];
    let mut draw = Draw(3);
    for case in 0..24 {
        let prompt = draw.pick(&prompts).clone();
        let extra = *draw.pick(&flags);
        let mut args: Vec<String> = vec![
            "generate".into(),
            "--model".into(),
            s(&model),
            "--prompt".into(),
            prompt,
            "--max-new-tokens".into(),
            "4".into(),
        ];
        args.extend(extra.iter().map(|a| a.to_string()));
        run(&args, &format!("generate {case}: {extra:?}"));
    }
    let plain = run(
        &[
            "generate".into(),
            "--model".into(),
            s(&model),
            "--prompt".into(),
            "2 + 2 =".into(),
            "--max-new-tokens".into(),
            "4".into(),
        ],
        "generate, a plain prompt",
    );
    assert_eq!(plain, 0);
    // A prompt file with hostile lines.
    let input = tmp.path().join("prompts.jsonl");
    std::fs::write(
        &input,
        format!(
            "{}\n{{\"prompt\": 5}}\nnot json\n{}\n",
            serde_json::json!({"prompt": "hi"}),
            serde_json::json!({"prompt": "y".repeat(1 << 20)})
        ),
    )
    .expect("w");
    run(
        &[
            "generate".into(),
            "--model".into(),
            s(&model),
            "--input".into(),
            s(&input),
            "--max-new-tokens".into(),
            "4".into(),
        ],
        "generate from a hostile file",
    );
}

/// `score` on hostile responses and gold answers.
#[test]
fn score_survives_hostile_answers() {
    let tmp = tempfile::tempdir().expect("tmp");
    let answers = [
        "\\boxed{4}".to_string(),
        "\\boxed{10^{10^{10^{10}}}}".into(),
        format!("\\boxed{{{}}}", "9".repeat(100_000)),
        "\\boxed{\\frac{1}{0}}".into(),
        format!("\\boxed{{{}}}", "\\sqrt{".repeat(5_000)),
        "\\boxed{".into(),
        "\u{0}".into(),
        String::new(),
    ];
    let mut lines = String::new();
    let mut draw = Draw(8);
    for _ in 0..40 {
        let line = serde_json::json!({
            "response": draw.pick(&answers),
            "answer": draw.pick(&answers),
        });
        lines.push_str(&format!("{line}\n"));
    }
    let input = tmp.path().join("answers.jsonl");
    std::fs::write(&input, lines).expect("w");
    // every hostile answer is judged (within the verifier's work budget): the file scores
    assert_eq!(
        run(&["score".into(), "--input".into(), s(&input)], "score"),
        0
    );
    for (i, bad) in ["not json", "{\"response\": 1}", "{\"answer\": \"4\"}"]
        .iter()
        .enumerate()
    {
        let path = tmp.path().join(format!("bad{i}.jsonl"));
        std::fs::write(&path, format!("{bad}\n")).expect("w");
        let code = run(
            &["score".into(), "--input".into(), s(&path)],
            "score, a bad line",
        );
        assert_eq!(code, 2, "{bad}");
    }
}
