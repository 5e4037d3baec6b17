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
fn run(args: &[String], what: &str) -> i32 {
    run_within(args, what, None).0
}

/// [`run`], under an address-space limit (`ulimit -v`) when one is given; the exit code and
/// what the command wrote to stderr.
#[allow(clippy::zombie_processes)]
fn run_within(args: &[String], what: &str, address_space: Option<u64>) -> (i32, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_acpo"));
    command
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(bytes) = address_space {
        use std::os::unix::process::CommandExt;
        let limit = libc::rlimit {
            rlim_cur: bytes as libc::rlim_t,
            rlim_max: bytes as libc::rlim_t,
        };
        // SAFETY: setrlimit is async-signal-safe and touches only the child's own limits.
        unsafe {
            command.pre_exec(move || {
                if libc::setrlimit(libc::RLIMIT_AS, &limit) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            });
        }
    }
    let mut child = command.spawn().expect("acpo runs");
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
    (code, stderr)
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

/// `acpo model init` of the config at `config` into `out`, with the character tokenizer.
fn init_args(config: &Path, out: &Path) -> Vec<String> {
    vec![
        "model".into(),
        "init".into(),
        "--config".into(),
        s(config),
        "--out".into(),
        s(out),
        "--char-tokenizer".into(),
    ]
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

/// The tiny model (`tiny_config`, the character tokenizer) written into `dir/tiny`.
fn tiny_model(dir: &Path) -> std::path::PathBuf {
    let model = dir.join("tiny");
    let cfg = dir.join("tiny.json");
    std::fs::write(&cfg, tiny_config().to_string()).expect("w");
    assert_eq!(run(&init_args(&cfg, &model), "the tiny model"), 0);
    model
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
        let made = run(&init_args(&path, &out), &format!("model init, {field}"));
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
    let model = tiny_model(tmp.path());
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

/// Issue #35, items 1 and 2, case by case as the issue names them: sizes that overflowed,
/// zero sizes that panicked later, sizes whose memory no machine has, a negative ε or θ, a
/// manifest naming such a config (`check` accepted it, `train` failed on an unnamed shape),
/// inputs past the model's positions, sequence counts and a prompt whose encoding the process
/// cannot hold: each refused with exit 2, one error naming the file and the field or flag.
#[test]
fn the_issues_named_sizes_and_inputs_are_refused_naming_the_field() {
    let tmp = tempfile::tempdir().expect("tmp");
    let configs: [(&str, serde_json::Value); 9] = [
        ("hidden_size", serde_json::json!(1u64 << 63)),
        ("intermediate_size", serde_json::json!(0)),
        ("hidden_size", serde_json::json!(0)),
        ("head_dim", serde_json::json!(0)),
        ("hidden_size", serde_json::json!(1_000_000_000u64)),
        ("vocab_size", serde_json::json!(1_000_000_000_000u64)),
        ("num_hidden_layers", serde_json::json!(1_000_000)),
        ("rms_norm_eps", serde_json::json!(-1e-6)),
        ("rope_theta", serde_json::json!(-5.0)),
    ];
    for (i, (field, value)) in configs.iter().enumerate() {
        let mut cfg = tiny_config();
        cfg[*field] = value.clone();
        if *field == "rope_theta" {
            cfg.as_object_mut()
                .expect("object")
                .remove("rope_parameters");
        }
        let path = tmp.path().join(format!("config{i}.json"));
        std::fs::write(&path, cfg.to_string()).expect("w");
        let out = tmp.path().join(format!("m{i}"));
        let (code, stderr) = run_within(
            &init_args(&path, &out),
            &format!("model init, {field} = {value}"),
            None,
        );
        assert_eq!(code, 2, "{field} = {value}: {stderr}");
        assert!(
            stderr.contains(&format!("config{i}.json")) && stderr.contains(field),
            "{field} = {value}: {stderr}"
        );
        assert!(!out.exists(), "nothing written for {field} = {value}");
    }

    // A manifest whose model is created from a zero-size config: `check` and `train` refuse it,
    // naming the manifest's field and the config's.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = tmp.path().join("zero/smoke-ppo.yaml");
    std::fs::create_dir_all(manifest.parent().expect("dir")).expect("mkdir");
    let text = std::fs::read_to_string(root.join("experiments/smoke/smoke-ppo.yaml"))
        .expect("manifest")
        .replace(
            "config: experiments/smoke/tiny-qwen3.json",
            &format!("config: {}", s(&tmp.path().join("config1.json"))),
        )
        .replace(
            "dir: models/smoke-qwen3-tiny",
            &format!("dir: {}", s(&tmp.path().join("absent"))),
        );
    std::fs::write(&manifest, text).expect("w");
    for command in [
        vec!["check".to_string(), s(&manifest)],
        vec![
            "train".into(),
            s(&manifest),
            "--out".into(),
            s(&tmp.path().join("results")),
        ],
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_acpo"))
            .args(&command)
            .output()
            .expect("acpo runs");
        let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command:?}: {said}");
        assert!(
            said.contains("model.init.config") && said.contains("intermediate_size"),
            "{command:?}: {said}"
        );
    }
    assert!(!tmp.path().join("absent").exists() && !tmp.path().join("results").exists());

    // Inputs past the tiny model's 256 positions, and sizes of work: refused before any is done.
    let model = tiny_model(tmp.path());
    let long = tmp.path().join("long.jsonl");
    std::fs::write(
        &long,
        format!("{}\n", serde_json::json!({"ids": vec![5u32; 200_000]})),
    )
    .expect("w");
    let big = tmp.path().join("big.jsonl");
    std::fs::write(
        &big,
        format!("{}\n", serde_json::json!({"prompt": "y".repeat(10 << 20)})),
    )
    .expect("w");
    let two = tmp.path().join("two.jsonl");
    std::fs::write(
        &two,
        "{\"prompt\": \"2 + 2 =\"}\n{\"prompt\": \"3 + 3 =\"}\n",
    )
    .expect("w");
    let generate = |extra: &[&str]| -> Vec<String> {
        ["generate", "--model", &s(&model)]
            .iter()
            .chain(extra)
            .map(|a| a.to_string())
            .collect()
    };
    let hundred_k = "x".repeat(100_000);
    let cases: [(Vec<String>, Option<u64>, &str); 7] = [
        (
            ["model", "logprobs", "--model", &s(&model), "--input", &s(&long)]
                .iter()
                .map(|a| a.to_string())
                .chain(["--output".into(), s(&tmp.path().join("lp.jsonl"))])
                .collect(),
            None,
            "long.jsonl:1: 200000 tokens, beyond the model's max_position_embeddings",
        ),
        (
            generate(&["--prompt", &hundred_k, "--max-new-tokens", "4"]),
            None,
            "prompt 0: 100000 tokens + --max-new-tokens 4 run past the model's max_position_embeddings",
        ),
        // Beyond the flags' ranges (issue #47): refused by the parser, naming the flag.
        (
            generate(&["--prompt", "2 + 2 =", "--n", "1000000000", "--max-new-tokens", "4"]),
            None,
            "invalid value '1000000000' for '--n <N>'",
        ),
        (
            generate(&["--prompt", "2 + 2 =", "--max-new-tokens", "1000000000"]),
            None,
            "invalid value '1000000000' for '--max-new-tokens <MAX_NEW_TOKENS>'",
        ),
        // Within them, but more than this model and this call can take.
        (
            generate(&["--input", &s(&two), "--n", "1000000", "--max-new-tokens", "4"]),
            None,
            "--n 1000000: 2 prompts × 1000000",
        ),
        (
            generate(&["--prompt", "2 + 2 =", "--max-new-tokens", "4000000"]),
            None,
            "--max-new-tokens 4000000 run past the model's max_position_embeddings",
        ),
        // A 10 MB prompt's encoding needs more than a process limited to 3 GiB of address
        // space may take: refused before the tokenizer runs.
        (
            generate(&["--input", &s(&big), "--max-new-tokens", "4"]),
            Some(3 << 30),
            "encoding prompt 0 of",
        ),
    ];
    for (args, address_space, says) in cases {
        let (code, stderr) = run_within(&args, says, address_space);
        assert_eq!(code, 2, "{says}: {stderr}");
        assert!(stderr.contains(says), "{says}: {stderr}");
    }
}

/// A pipe named as any file a command reads (a prompt or id file, a config, a model's files, a
/// manifest, a sweep spec, an archive, a document or one of its generated files) is refused at
/// once with exit 2 naming it: opening a FIFO waits for a writer, so each of these hung before.
/// Also the plans nothing could finish: `reproduce --seeds` beyond [`acpo::reproduce::MAX_RUNS`]
/// runs, and `doc --from` a folder that is not there.
#[test]
fn a_pipe_named_as_any_input_is_refused_at_once() {
    let tmp = tempfile::tempdir().expect("tmp");
    let fifo = |path: &Path| {
        std::fs::create_dir_all(path.parent().expect("dir")).expect("mkdir");
        let made = Command::new("mkfifo").arg(path).status();
        made.is_ok_and(|s| s.success())
    };
    let pipe = tmp.path().join("pipe");
    if !fifo(&pipe) {
        crate::skip(
            "a_pipe_named_as_any_input_is_refused_at_once",
            format_args!("no mkfifo"),
        );
        return;
    }
    let model = tiny_model(tmp.path());
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<String>>();
    // A model directory whose config, tokenizer or weights is a pipe.
    let mut models = Vec::new();
    for file in ["config.json", "tokenizer.json", "model.safetensors"] {
        let copy = tmp.path().join(format!("piped-{file}"));
        std::fs::create_dir_all(&copy).expect("mkdir");
        for entry in std::fs::read_dir(&model).expect("ls") {
            let entry = entry.expect("entry");
            std::fs::copy(entry.path(), copy.join(entry.file_name())).expect("cp");
        }
        std::fs::remove_file(copy.join(file)).expect("rm");
        assert!(fifo(&copy.join(file)));
        models.push((copy, file));
    }
    let docs = tmp.path().join("docs");
    std::fs::create_dir_all(&docs).expect("mkdir");
    assert!(fifo(&docs.join("piped.md")));
    let doc = tmp.path().join("doc.md");
    std::fs::write(&doc, "<!-- begin: piped.md -->\n<!-- end: piped.md -->\n").expect("w");
    let p = s(&pipe);
    let mut cases: Vec<(Vec<String>, String)> = vec![
        (args(&["score", "--input", &p]), p.clone()),
        (
            args(&["generate", "--model", &s(&model), "--input", &p]),
            p.clone(),
        ),
        (
            args(&[
                "model",
                "logprobs",
                "--model",
                &s(&model),
                "--input",
                &p,
                "--output",
            ])
            .into_iter()
            .chain([s(&tmp.path().join("lp.jsonl"))])
            .collect(),
            p.clone(),
        ),
        (
            args(&["model", "init", "--config", &p, "--out"])
                .into_iter()
                .chain([s(&tmp.path().join("m")), "--char-tokenizer".into()])
                .collect(),
            p.clone(),
        ),
        (args(&["check", &p]), p.clone()),
        (args(&["train", &p]), p.clone()),
        (args(&["export", "verl", &p]), p.clone()),
        (args(&["verify", &p]), p.clone()),
        (args(&["sweep", &p]), p.clone()),
        (
            args(&[
                "reproduce",
                "all",
                "--scale",
                "mini",
                "--from",
                &p,
                "--results",
            ])
            .into_iter()
            .chain([s(&tmp.path().join("r"))])
            .collect(),
            p.clone(),
        ),
        (args(&["doc", &p, "--from", &s(&docs)]), p.clone()),
        (
            args(&["doc", &s(&doc), "--from", &s(&docs)]),
            "piped.md".into(),
        ),
    ];
    for (dir, file) in &models {
        cases.push((
            args(&[
                "generate",
                "--model",
                &s(dir),
                "--prompt",
                "hi",
                "--max-new-tokens",
                "2",
            ]),
            file.to_string(),
        ));
    }
    for (args, names) in cases {
        let started = Instant::now();
        let (code, stderr) = run_within(&args, &format!("{args:?}"), None);
        assert_eq!(code, 2, "{args:?}: {stderr}");
        assert!(
            stderr.contains(&names) && stderr.contains("regular file"),
            "{args:?}: {stderr}"
        );
        assert!(started.elapsed() < Duration::from_secs(30), "{args:?}");
    }

    // What the process was handed open is read as it is: the verl reward pipes its batch into
    // `acpo score --input /dev/stdin`.
    let mut child = Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(["score", "--input", "/dev/stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("acpo runs");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        let line = serde_json::json!({"response": "\\boxed{4}", "answer": "4"});
        writeln!(stdin, "{line}").expect("write");
    }
    let scored = child.wait_with_output().expect("score");
    assert!(
        scored.status.success()
            && String::from_utf8_lossy(&scored.stdout).contains("\"correct\":true"),
        "{}",
        String::from_utf8_lossy(&scored.stderr)
    );

    let (code, stderr) = run_within(
        &args(&[
            "reproduce",
            "all",
            "--scale",
            "mini",
            "--seeds",
            "1000",
            "--results",
        ])
        .into_iter()
        .chain([s(&tmp.path().join("r"))])
        .collect::<Vec<_>>(),
        "reproduce --seeds 1000",
        None,
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(
        stderr.contains("--seeds 1000") && stderr.contains("4096 runs"),
        "{stderr}"
    );
    assert!(!tmp.path().join("r").exists());
    let (code, stderr) = run_within(
        &args(&["doc", &s(&doc), "--from", &s(&tmp.path().join("absent"))]),
        "doc --from a folder that is not there",
        None,
    );
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("absent: not a folder"), "{stderr}");
}
