//! The `acpo` binary as a user runs it: exit codes and messages.

use std::path::Path;
use std::process::{Command, Output};

fn acpo(args: &[&str], cwd: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("acpo runs")
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `acpo ARGS` from the repository, which must succeed (its stderr in the message), and
/// reads the JSON rows it wrote to `report`.
fn report_rows(args: &[&str], report: &Path) -> Vec<serde_json::Value> {
    let out = acpo(args, repo());
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(report).expect("a report")).expect("rows")
}

/// The number a shape's words give after `words` (`"at most 4 at once"` after `"at most "`).
fn number_after(shape: &str, words: &str) -> usize {
    shape
        .split(words)
        .nth(1)
        .and_then(|s| s.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no number after `{words}` in {shape}"))
}

/// Copies `experiments/` into `dir`: manifests name their model config relative to the
/// working directory, as a user running from the repository root has it.
fn copy_experiments(dir: &Path) {
    let status = Command::new("cp")
        .args([
            "-r",
            repo().join("experiments").to_str().expect("u"),
            dir.to_str().expect("u"),
        ])
        .status()
        .expect("cp");
    assert!(status.success());
}

#[test]
fn check_accepts_every_committed_manifest() {
    let out = acpo(&["check", "experiments"], repo());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{}",
        stdout,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("ok  ")).count() + 1,
        stdout.lines().count()
    );
    assert!(stdout.contains("qwen3-8b-grpo-ac") && stdout.contains("alpha=2"));
}

/// Issue #17, item 8: a FIFO (or a device) as a manifest is refused at once instead of blocking
/// `check` or `train` forever.
#[cfg(unix)]
#[test]
fn a_fifo_manifest_is_refused_instead_of_blocking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("run.yaml");
    let made = Command::new("mkfifo").arg(&fifo).status().expect("mkfifo");
    assert!(made.success());
    for args in [
        vec!["check", "."],
        vec!["train", "run.yaml"],
        vec!["train", "/dev/zero"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_acpo"))
            .args(&args)
            .current_dir(dir.path())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("acpo runs");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while child.try_wait().expect("wait").is_none() {
            if std::time::Instant::now() > deadline {
                child.kill().expect("kill");
                panic!("{args:?} blocked on a FIFO");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().expect("output");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("not a manifest"), "{args:?}: {stderr}");
    }
}

/// Issue #17, item 11: an error names its cause once (the OS error was printed twice).
#[test]
fn a_missing_file_is_named_once_with_its_os_error_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    for args in [
        &["score", "--input", "absent.jsonl"][..],
        &["train", "absent.yaml"][..],
        &[
            "generate",
            "--model",
            "absent-dir",
            "--input",
            "absent.jsonl",
        ][..],
    ] {
        let out = acpo(args, dir.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
        assert!(stderr.contains("absent."), "{args:?}: {stderr}");
        assert_eq!(
            stderr.matches("(os error").count(),
            1,
            "{args:?}: the cause once: {stderr}"
        );
    }
}

#[test]
fn check_on_a_broken_manifest_exits_2_naming_file_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let good = std::fs::read_to_string(repo().join("experiments/paper/qwen3-8b-ppo-ac.yaml"))
        .expect("read");
    std::fs::write(
        dir.path().join("qwen3-8b-ppo-ac.yaml"),
        good.replace("alpha: 3.0", "alpha: -3.0"),
    )
    .expect("write");
    let out = acpo(&["check", "."], dir.path());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "qwen3-8b-ppo-ac.yaml: field `algorithm.alpha`: must be a finite number > 0, got -3"
        ),
        "{stderr}"
    );
    assert_eq!(
        stderr.lines().count(),
        2,
        "one line per bad file plus the summary: {stderr}"
    );
}

#[test]
fn check_reports_a_missing_path_and_duplicate_run_names() {
    let out = acpo(&["check", "no/such/dir"], repo());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no/such/dir"));

    let dir = tempfile::tempdir().expect("tempdir");
    let good =
        std::fs::read_to_string(repo().join("experiments/paper/qwen3-8b-ppo.yaml")).expect("read");
    for sub in ["a", "b"] {
        std::fs::create_dir(dir.path().join(sub)).expect("mkdir");
        std::fs::write(dir.path().join(sub).join("qwen3-8b-ppo.yaml"), &good).expect("write");
    }
    let out = acpo(&["check", "."], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is already the name of"));
}

#[test]
fn pmd_writes_its_table_and_figure_and_passes_its_own_checks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = acpo(
        &["pmd", "--out", "figs", "--mdps", "2", "--iterations", "40"],
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in ["pmd.md", "pmd.json", "pmd.png", "pmd.svg"] {
        let meta = std::fs::metadata(dir.path().join("figs").join(f)).expect(f);
        assert!(meta.len() > 500, "{f} is nearly empty");
    }
    let md = std::fs::read_to_string(dir.path().join("figs/pmd.md")).expect("md");
    assert!(md.contains("| (iv) |") && md.contains("Proposition 1") && !md.contains("**NO**"));
    let bad = acpo(&["pmd", "--out", "figs", "--mdps", "0"], dir.path());
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn a_scale_without_manifests_is_an_input_error() {
    // A scale without manifests is an input error naming the directory, not a silent success.
    let out = acpo(
        &[
            "reproduce",
            "table1",
            "--scale",
            "mini",
            "--experiments",
            "no-such-experiments",
        ],
        repo(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no-such-experiments"));
}

#[test]
fn usage_errors_exit_2_and_help_lists_every_subcommand() {
    let out = acpo(&["check", "--no-such-flag"], repo());
    assert_eq!(out.status.code(), Some(2));
    let help = acpo(&["--help"], repo());
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    for sub in [
        "check",
        "train",
        "generate",
        "score",
        "eval",
        "report",
        "reproduce",
        "archive",
        "verify",
        "bench",
        "pmd",
        "model",
    ] {
        assert!(
            text.contains(&format!("  {sub}")),
            "--help lacks {sub}:\n{text}"
        );
    }
}

#[test]
fn model_init_then_generate_samples_with_the_real_tokenizer_and_chat_template() {
    let dir = tempfile::tempdir().expect("tempdir");
    let Some(model) = super::tiny_full_vocab_model(
        dir.path(),
        "model_init_then_generate_samples_with_the_real_tokenizer_and_chat_template",
    ) else {
        return;
    };
    let jsonl = dir.path().join("out.jsonl");
    let args = [
        "generate",
        "--model",
        model.to_str().expect("utf8"),
        "--prompt",
        "What is 1+1?",
        "--chat",
        "--n",
        "3",
        "--max-new-tokens",
        "5",
        "--seed",
        "9",
        "--output",
        jsonl.to_str().expect("utf8"),
    ];
    let out = acpo(&args, repo());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&jsonl).expect("output");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(lines.len(), 3);
    for l in &lines {
        assert_eq!(l["prompt"], "What is 1+1?");
        assert!(
            l["num_tokens"].as_u64().expect("n") >= 1 && l["num_tokens"].as_u64().expect("n") <= 5
        );
    }
    // Seeded: the same command gives the same completions.
    let first = text.clone();
    assert!(acpo(&args, repo()).status.success());
    assert_eq!(std::fs::read_to_string(&jsonl).expect("output"), first);
    // A model directory without a tokenizer is one clear error, exit 2.
    std::fs::remove_file(model.join("tokenizer.json")).expect("rm");
    let out = acpo(
        &[
            "generate",
            "--model",
            model.to_str().expect("utf8"),
            "--prompt",
            "x",
        ],
        repo(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("tokenizer.json"));
}

#[test]
fn generate_over_the_paged_kv_cache_writes_the_same_completions() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = dir.path().join("tiny");
    let config = repo().join("tests/fixtures/tiny-qwen3/config.json");
    let init = [
        "model",
        "init",
        "--config",
        config.to_str().expect("utf8"),
        "--out",
        model.to_str().expect("utf8"),
        "--char-tokenizer",
    ];
    let out = acpo(&init, repo());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let jsonl = dir.path().join("out.jsonl");
    let args = [
        "generate",
        "--model",
        model.to_str().expect("utf8"),
        "--prompt",
        "2 + 2 =",
        "--n",
        "4",
        "--max-new-tokens",
        "40",
        "--seed",
        "5",
        "--output",
        jsonl.to_str().expect("utf8"),
    ];
    let run = |extra: &[&str]| -> String {
        let all: Vec<&str> = args.iter().chain(extra).copied().collect();
        let out = acpo(&all, repo());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read_to_string(&jsonl).expect("output")
    };
    let dense = run(&[]);
    assert_eq!(dense.lines().count(), 4);
    // The four completions share the prompt's prefill and blocks: the same completions.
    assert_eq!(run(&["--paged-kv"]), dense);
}

#[test]
fn bench_writes_a_report() {
    // Both throughput benchmarks, on the tiny model; train-step runs the trainer's micro-batches
    // side by side, its summed gradients and the AdamW update; in f32, and in bf16 arithmetic on
    // fp32 masters (the precision policy; `--device cuda` on the CUDA binary).
    for (kind, dtype) in [
        ("generate", "f32"),
        ("train-step", "f32"),
        ("train-step", "bf16"),
        ("attention", "f32"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let rows = report_rows(
            &[
                "bench",
                kind,
                "--tiny-only",
                "--repeats",
                "1",
                "--dtype",
                dtype,
                "--out",
                dir.path().to_str().expect("utf8"),
            ],
            &dir.path().join(format!("{kind}.json")),
        );
        assert_eq!(rows[0]["model"], "tiny");
        assert_eq!(rows[0]["what"], kind);
        assert_eq!(rows[0]["target"], format!("cpu/{dtype}"));
        assert!(rows[0]["tokens_per_second"].as_f64().expect("tps") > 0.0);
        assert!(
            std::fs::read_to_string(dir.path().join(format!("{kind}.md")))
                .expect("md")
                .contains("| tiny |")
        );
    }
}

/// `acpo bench kernels-load` loads the kernel modules on a GPU; elsewhere it says so and exits 2,
/// writing nothing. (On the GPU the suite runs it first, `tools/gpu/suite.sh`.)
#[test]
fn bench_kernels_load_needs_a_gpu_and_says_so() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("kernels-load");
    let args = [
        "bench",
        "kernels-load",
        "--out",
        out.to_str().expect("utf8"),
    ];
    let run = acpo(&args, repo());
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("needs a CUDA GPU"), "{stderr}");
    assert!(!out.exists(), "nothing written");
}

#[test]
fn bench_generate_takes_an_fp8_kv_cache_and_counts_its_bytes_where_it_holds_them() {
    // On the CPU an FP8 cache keeps E4M3 values in the model's dtype: the run samples through
    // the rounding (another run's tokens) and its roofline counts the bytes the cache holds,
    // the model dtype's, not one a number (only a GPU's cache holds bytes).
    let run = |cache: &str| {
        let dir = tempfile::tempdir().expect("tempdir");
        let rows = report_rows(
            &[
                "bench",
                "generate",
                "--tiny-only",
                "--repeats",
                "1",
                "--kv-cache",
                cache,
                "--out",
                dir.path().to_str().expect("utf8"),
            ],
            &dir.path().join("generate.json"),
        );
        rows[0].clone()
    };
    let (model, fp8) = (run("model"), run("fp8"));
    assert!(fp8["tokens_per_second"].as_f64().expect("tps") > 0.0);
    assert_eq!(
        fp8["roofline"]["bytes_per_step"],
        model["roofline"]["bytes_per_step"]
    );
    assert!(!fp8["shape"].as_str().expect("shape").contains("FP8"));
    // the fixed shape's decode says how much of its time was the host's
    for row in [&model, &fp8] {
        let share = row["roofline"]["host_share"].as_f64().expect("host share");
        assert!((0.0..=1.0).contains(&share), "{share}");
    }
    let out = acpo(&["bench", "generate", "--kv-cache", "fp4"], repo());
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn bench_train_step_takes_a_config_a_shape_and_the_memory_settings_and_reports_peak_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = repo().join("experiments/smoke/tiny-qwen3.json");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "bench",
            "train-step",
            "--config",
            config.to_str().expect("utf8"),
            "--seq-len",
            "40",
            "--prompt-len",
            "8",
            "--micro-batch",
            "2",
            "--repeats",
            "1",
            "--out",
            dir.path().to_str().expect("utf8"),
        ];
        args.extend_from_slice(extra);
        let rows = report_rows(&args, &dir.path().join("train-step.json"));
        rows[0].clone()
    };
    let plain = run(&[]);
    assert_eq!(plain["model"], "tiny-qwen3");
    assert_eq!(plain["tokens"], 80);
    assert!(plain["shape"]
        .as_str()
        .expect("shape")
        .contains("composed attention"));
    let mem = &plain["memory"];
    assert!(mem["peak"].as_u64().expect("a peak on Linux") > 0, "{mem}");
    assert!(mem["masters"].as_u64().expect("masters") > 0);
    let all = run(&[
        "--attention",
        "flash",
        "--vocab-chunk",
        "64",
        "--checkpointing",
        "--layer-by-hand",
        "--flash-backward",
        "five",
    ]);
    let shape = all["shape"].as_str().expect("shape");
    for part in [
        "flash attention",
        "vocab chunks of 64",
        "checkpointing",
        "layer backward by hand",
    ] {
        assert!(shape.contains(part), "{shape}");
    }
    // The report says which attention backward ran, not which was asked: the 5 products run on
    // CUDA's tensor-core kernels only, and the CPU twin has one backward.
    assert!(!shape.contains("5 products"), "{shape}");
    assert_eq!(
        acpo::fused::FlashBackward::FiveProducts.runs_on(
            &candle_core::Device::Cpu,
            candle_core::DType::F32,
            128
        ),
        acpo::fused::FlashBackward::Pair
    );
    // Likewise the attention benchmark.
    let rows = report_rows(
        &[
            "bench",
            "attention",
            "--config",
            config.to_str().expect("utf8"),
            "--seq-len",
            "40",
            "--micro-batch",
            "2",
            "--attention",
            "flash",
            "--flash-backward",
            "five",
            "--repeats",
            "1",
            "--out",
            dir.path().to_str().expect("utf8"),
        ],
        &dir.path().join("attention.json"),
    );
    let shape = rows[0]["shape"].as_str().expect("shape");
    assert!(shape.starts_with("flash: 2×40"), "{shape}");
    // The timed steps run untraced (a trace waits for the device at every part): the trace
    // holds one step, the extra one after the timed two.
    let rows = report_rows(
        &[
            "bench",
            "train-step",
            "--config",
            config.to_str().expect("utf8"),
            "--seq-len",
            "40",
            "--prompt-len",
            "8",
            "--micro-batch",
            "2",
            "--checkpointing",
            "--trace",
            "--repeats",
            "2",
            "--out",
            dir.path().to_str().expect("utf8"),
        ],
        &dir.path().join("train-step.json"),
    );
    let traced = &rows[0];
    let marks = traced["trace"].as_array().expect("a trace");
    let steps = marks
        .iter()
        .filter(|m| m["phase"] == "actor mini-batch 0: the optimizer step")
        .count();
    assert_eq!(steps, 1, "{marks:?}");
    assert_eq!(traced["repeats"], 2);
    assert!(traced["seconds"].as_f64().expect("seconds") > 0.0);
    // A shape that cannot be a step is refused with exit 2 naming the flags.
    let out = acpo(
        &[
            "bench",
            "train-step",
            "--tiny-only",
            "--seq-len",
            "8",
            "--prompt-len",
            "8",
            "--out",
            dir.path().to_str().expect("utf8"),
        ],
        repo(),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--prompt-len"));
}

#[test]
fn bench_generate_compares_waves_with_continuous_batching_on_long_tails() {
    // With --paged-kv a third run: the same work through the paged KV cache.
    for paged in [false, true] {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut args = vec![
            "bench",
            "generate",
            "--tiny-only",
            "--long-tail",
            "--batch",
            "12",
            "--new-tokens",
            "16",
            "--max-batch",
            "4",
            "--repeats",
            "1",
            "--out",
            dir.path().to_str().expect("utf8"),
        ];
        if paged {
            args.push("--paged-kv");
        }
        let rows = report_rows(&args, &dir.path().join("generate.json"));
        assert_eq!(rows.len(), 2 + usize::from(paged));
        let shape = |i: usize| rows[i]["shape"].as_str().expect("s").to_string();
        assert!(shape(0).ends_with("waves"));
        // every prompt past the first 4 joins; where as many wait as rows finished, in place
        let how = shape(1);
        let joined = number_after(&how, "continuous batching (");
        assert!((1..=8).contains(&joined), "{how}");
        assert!(how.contains("copies of the batch's cache"), "{how}");
        // The same work every way: the long-tailed lengths' sum.
        let want: usize = acpo::perf::long_tail_lengths(12, 16).iter().sum();
        for row in &rows {
            assert_eq!(row["tokens"], want);
        }
        if paged {
            // --max-batch still caps the rows the pool admits
            let most = number_after(&shape(2), "at most ");
            assert!(shape(2).contains("paged KV cache") && (1..=4).contains(&most));
            // and the prefill goes in groups under its token budget (on the CPU: one group of
            // the admitted prompts, at most --max-batch of 32 positions; a prompt whose response
            // is its first token is prefilled but never decodes, so it can exceed `most`)
            let widest = number_after(&shape(2), "the widest prefill ");
            assert!((32..=4 * 32).contains(&widest), "{}", shape(2));
            // its roofline counts what the engine read: on the CPU the pool holds every row
            // and admits them as the dense engine does, so the same bytes a step
            let bytes = |i: usize| {
                rows[i]["roofline"]["bytes_per_step"]
                    .as_f64()
                    .expect("bytes")
            };
            assert!(
                (bytes(2) / bytes(1) - 1.0).abs() < 1e-12,
                "{} vs {}",
                bytes(2),
                bytes(1)
            );
            // and both decode runs say how much of their decode time was the host's
            for i in [1, 2] {
                let share = rows[i]["roofline"]["host_share"]
                    .as_f64()
                    .expect("host share");
                assert!((0.0..=1.0).contains(&share), "row {i}: {share}");
            }
        }
    }
}

/// `--group`: the rows are prompts sampled several times each (a GRPO group, Avg@k's k); the
/// paged engine prefills a group's prompt once, the dense ones each row's, and the work is the
/// same. A group that does not divide the batch is refused, naming the flag.
#[test]
fn bench_generate_samples_groups_and_the_paged_engine_prefills_each_prompt_once() {
    let widest = |extra: &[&str]| {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().to_str().expect("utf8");
        let mut args = vec![
            "bench",
            "generate",
            "--tiny-only",
            "--long-tail",
            "--paged-kv",
            "--batch",
            "12",
            "--new-tokens",
            "16",
            "--repeats",
            "1",
            "--out",
            out,
        ];
        args.extend(extra);
        let rows = report_rows(&args, &dir.path().join("generate.json"));
        // --paged-only: the paged run alone; else waves and the dense cache's run before it
        let alone = extra.contains(&"--paged-only");
        assert_eq!(rows.len(), if alone { 1 } else { 3 });
        let want: usize = acpo::perf::long_tail_lengths(12, 16).iter().sum();
        let grouped = extra.contains(&"4");
        for row in &rows {
            assert_eq!(row["tokens"], want);
            let shape = row["shape"].as_str().expect("s");
            assert_eq!(
                shape.starts_with("12 prompts of 32 (3 distinct × 4 responses), "),
                grouped,
                "{shape}"
            );
            assert_eq!(shape.contains("distinct"), grouped, "{shape}");
        }
        let paged = rows[rows.len() - 1]["shape"]
            .as_str()
            .expect("s")
            .to_string();
        assert!(paged.contains(", continuous batching over the paged KV cache, "));
        number_after(&paged, "the widest prefill ")
    };
    // On the CPU the pool admits every row at once: 12 prompts of 32 positions, or 3.
    assert_eq!(widest(&["--group", "1"]), 12 * 32);
    assert_eq!(widest(&["--group", "4"]), 3 * 32);
    assert_eq!(widest(&["--group", "4", "--paged-only"]), 3 * 32);
    // Refused, exit 2, naming the flag, nothing written: a group that does not divide the
    // batch, and the paged run alone without the long-tail benchmark's paged run.
    for (args, says) in [
        (&["--group", "5"][..], "--group 5 must divide --batch 12"),
        (&["--long-tail", "--paged-only"][..], "--paged-only"),
        (&["--paged-kv", "--paged-only"][..], "--paged-only"),
    ] {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = dir.path().to_str().expect("utf8");
        let mut all = vec![
            "bench",
            "generate",
            "--tiny-only",
            "--batch",
            "12",
            "--out",
            out,
        ];
        all.extend(args);
        let got = acpo(&all, repo());
        assert_eq!(got.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&got.stderr).contains(says),
            "{args:?}: {}",
            String::from_utf8_lossy(&got.stderr)
        );
        assert!(std::fs::read_dir(dir.path()).expect("ls").next().is_none());
    }
}

#[test]
fn bench_paper_plan_costs_every_paper_run_from_measured_rates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().to_str().expect("utf8");
    // Without measurements: refused, naming the flag.
    let refused = acpo(&["bench", "paper-plan", "--out", out], repo());
    assert_eq!(refused.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("--measured"));
    // Two measurement files in the reports' format (made-up rates: this tests the arithmetic).
    let row = |what: &str, tps: f64| {
        serde_json::json!([{"model": "qwen3-1.7b", "parameters": 1_720_574_976u64, "what": what,
            "target": "cuda/bf16", "tokens": 1000, "seconds": 1000.0 / tps,
            "tokens_per_second": tps, "repeats": 1}])
    };
    let measured = dir.path().join("measured");
    std::fs::create_dir(&measured).expect("dir");
    std::fs::write(
        measured.join("train-step.json"),
        row("train-step", 10_000.0).to_string(),
    )
    .expect("w");
    // a long-tail run's rows: waves, continuous batching, then the paged engine, whose rate
    // (the last row's) the plan takes
    let mut generate = row("generate", 5_000.0);
    generate[0]["roofline"] = serde_json::json!({"copy_gb_per_s": 3_000.0});
    let earlier = [
        row("generate", 900.0)[0].clone(),
        row("generate", 1_700.0)[0].clone(),
    ];
    let generate = serde_json::json!([earlier[0], earlier[1], generate[0]]);
    std::fs::write(measured.join("generate.json"), generate.to_string()).expect("w");
    // the plan of the rates in `measured`, its rows
    let plan = || {
        report_rows(
            &[
                "bench",
                "paper-plan",
                "--measured",
                measured.to_str().expect("u"),
                "--out",
                out,
            ],
            &dir.path().join("paper-plan.json"),
        )
    };
    let rows = plan();
    assert_eq!(rows.len(), 16);
    let hours = |run: &str| {
        rows.iter().find(|r| r["run"] == run).expect(run)["gpu_hours"]
            .as_f64()
            .expect("h")
    };
    // A larger model costs more; a critic costs more than none.
    assert!(hours("qwen3-8b-grpo") > hours("qwen3-1.7b-grpo"));
    assert!(hours("qwen3-1.7b-ppo") > 0.0);
    assert_eq!(
        rows.iter().find(|r| r["run"] == "qwen3-8b-ppo").expect("r")["paper_gpus"],
        8
    );
    // The hours split into rollouts, evaluations and training; without generate-eval.json the
    // evaluations use the rollouts' rate, and the plan says so.
    let grpo = rows
        .iter()
        .find(|r| r["run"] == "qwen3-1.7b-grpo")
        .expect("r");
    let f = |k: &str| grpo[k].as_f64().unwrap_or_else(|| panic!("{k}"));
    let parts = f("rollout_hours") + f("eval_hours") + f("train_hours");
    assert!((parts - f("gpu_hours")).abs() < 1e-9 * parts, "{grpo}");
    let md = std::fs::read_to_string(dir.path().join("paper-plan.md")).expect("md");
    assert!(md.contains("the rollouts' rate"), "{md}");
    // The KV-bandwidth bound, by hand for Qwen3-1.7B (28 layers, 8 KV heads of 128, bf16):
    // 114,688 bytes per position; a rollout's mean context is DAPO-Math-17k's mean prompt (153
    // tokens) plus half of half the response limit (8,196 / 4 = 2,049); an evaluation
    // answer's the benchmarks' mean prompt (121) + 2,049.
    let per_position = 2.0 * 28.0 * 8.0 * 128.0 * 2.0;
    let (rollout_context, eval_context) = (153.0 + 2_049.0, 121.0 + 2_049.0);
    let bound = 3_000e9 / (per_position * rollout_context);
    assert!(
        (f("rollout_kv_bound_tps") / bound - 1.0).abs() < 1e-12,
        "{grpo}"
    );
    let eval_bound = 3_000e9 / (per_position * eval_context);
    assert!(
        (f("eval_kv_bound_tps") / eval_bound - 1.0).abs() < 1e-12,
        "{grpo}"
    );
    // Trained: 100 steps of 256 prompts × 4 responses, each its prompt (153) and half its limit
    // (4,098), through one update pass and the old log-probs' forward (a third of one).
    let trained = 100.0 * 1_024.0 * (153.0 + 4_098.0) * (1.0 + 1.0 / 3.0);
    assert!((f("train_tokens") / trained - 1.0).abs() < 1e-12, "{grpo}");
    assert!(f("gpu_hours_at_kv_bound") < f("gpu_hours"), "{grpo}");
    // An FP8 cache halves the KV bytes: the sampling hours at the bound halve, training's stay.
    let sampling_at_bound = f("gpu_hours_at_kv_bound") - f("train_hours");
    let fp8 = f("train_hours") + sampling_at_bound / 2.0;
    assert!(
        (f("gpu_hours_at_fp8_kv_bound") / fp8 - 1.0).abs() < 1e-12,
        "{grpo}"
    );
    // Without the sampling run's decode steps (their fraction of the copy rate and rows a
    // step), nothing is carried to the paper's contexts; with them (a quarter of the copy rate,
    // 64 rows a step), sampling runs as 64 rows a step would, moving the model's weights
    // (1,720,574,976 parameters in bf16) and each row's cache at the runs' mean context at a
    // quarter of the copy rate; training as measured.
    assert!(grpo["gpu_hours_at_paper_contexts"].is_null(), "{grpo}");
    assert!(md.contains("recorded no roofline"), "{md}");
    let mut generate = generate;
    generate[2]["roofline"]["fraction"] = serde_json::json!(0.25);
    generate[2]["roofline"]["decode_tokens_per_second"] = serde_json::json!(5_000.0);
    generate[2]["roofline"]["step_seconds"] = serde_json::json!(0.0128);
    std::fs::write(measured.join("generate.json"), generate.to_string()).expect("w");
    let carried = plan();
    let carried = carried
        .iter()
        .find(|r| r["run"] == "qwen3-1.7b-grpo")
        .expect("r");
    let rate = |context: f64| {
        0.25 * 3_000e9 * 64.0 / (2.0 * 1_720_574_976.0 + 64.0 * context * per_position)
    };
    let want = f("train_hours")
        + (f("sample_tokens") / rate(rollout_context) + f("eval_tokens") / rate(eval_context))
            / 3600.0;
    let got = carried["gpu_hours_at_paper_contexts"].as_f64().expect("h");
    assert!((got / want - 1.0).abs() < 1e-9, "{got} {want}");
    let md = std::fs::read_to_string(dir.path().join("paper-plan.md")).expect("md");
    assert!(
        md.contains("drew 64 (rollouts) and 64 (evaluations) rows a step"),
        "{md}"
    );
    assert!(md.contains("at 25.0 % and 25.0 % of the copy rate"), "{md}");
    // a measurement at the evaluation's own shape is used for the evaluations
    std::fs::write(
        measured.join("generate-eval.json"),
        row("generate", 10_000.0).to_string(),
    )
    .expect("w");
    let rows = plan();
    let eval_hours = rows
        .iter()
        .find(|r| r["run"] == "qwen3-1.7b-grpo")
        .expect("r")["eval_hours"]
        .as_f64()
        .expect("h");
    assert!(
        (eval_hours / f("eval_hours") - 0.5).abs() < 1e-9,
        "twice the rate, half the hours"
    );
    // Its decode steps, where it recorded none, are carried from the rollouts'; where it did
    // (here 128 rows a step at half the copy rate), from its own.
    let carried_hours = |rows: &[serde_json::Value]| {
        rows.iter()
            .find(|r| r["run"] == "qwen3-1.7b-grpo")
            .expect("r")["gpu_hours_at_paper_contexts"]
            .as_f64()
            .expect("carried")
    };
    let rate_at = |fraction: f64, rows: f64, context: f64| {
        fraction * 3_000e9 * rows / (2.0 * 1_720_574_976.0 + rows * context * per_position)
    };
    let from_rollouts = f("train_hours")
        + (f("sample_tokens") / rate_at(0.25, 64.0, rollout_context)
            + f("eval_tokens") / rate_at(0.25, 64.0, eval_context))
            / 3600.0;
    assert!((carried_hours(&rows) / from_rollouts - 1.0).abs() < 1e-9);
    let md = std::fs::read_to_string(dir.path().join("paper-plan.md")).expect("md");
    assert!(
        md.contains("The evaluations' measurement recorded no roofline: their decode steps are the rollouts'."),
        "{md}"
    );
    let mut own = row("generate", 10_000.0);
    own[0]["roofline"] = serde_json::json!({"copy_gb_per_s": 3_000.0, "fraction": 0.5,
        "decode_tokens_per_second": 12_800.0, "step_seconds": 0.01});
    std::fs::write(measured.join("generate-eval.json"), own.to_string()).expect("w");
    let rows = plan();
    let from_own = f("train_hours")
        + (f("sample_tokens") / rate_at(0.25, 64.0, rollout_context)
            + f("eval_tokens") / rate_at(0.5, 128.0, eval_context))
            / 3600.0;
    assert!((carried_hours(&rows) / from_own - 1.0).abs() < 1e-9);
    let md = std::fs::read_to_string(dir.path().join("paper-plan.md")).expect("md");
    assert!(
        md.contains("drew 64 (rollouts) and 128 (evaluations) rows a step")
            && md.contains("at 25.0 % and 50.0 % of the copy rate")
            && !md.contains("recorded no roofline"),
        "{md}"
    );
    // Without the GPU's memory the measured rows are carried as they are, and the plan says so.
    let rows_there = |rows: &[serde_json::Value]| {
        let r = rows
            .iter()
            .find(|r| r["run"] == "qwen3-1.7b-grpo")
            .expect("r");
        (
            r["rollout_rows_at_paper_contexts"].as_f64(),
            r["eval_rows_at_paper_contexts"].as_f64(),
        )
    };
    assert_eq!(rows_there(&rows), (Some(64.0), Some(128.0)));
    assert!(md.contains("no GPU memory beside the rates"), "{md}");
    // With it (an H200's, as the suite's header records it), the rows are capped at what the
    // sampler's pool holds at the paper's contexts beside the trainer's state. By hand: half of
    // 143,771 MiB less the trained model as it sits while sampling (1,720,574,976 parameters ×
    // 14 bytes: the fp32 master, the bf16 copy, two fp32 moments) and 2 GiB is 62,259,643,392
    // bytes, 16,964 blocks of 32 positions × 114,688 bytes; block 0 is the pool's, and a row at
    // the rollouts' mean context (2,202) holds 69 blocks, at the evaluations' (2,170) 68: 245
    // and 249 rows at most. A run measured at 577 and 1,483 rows a step (the next loan's
    // predicted paged runs) is carried at those; one at 64 rows keeps its 64.
    std::fs::write(
        measured.join("device.txt"),
        "# the header line of 1-suite/gpu-suite/summary.txt\n== suite on NVIDIA H200, 580.159.04, 143771 MiB\n",
    )
    .expect("w");
    generate[2]["roofline"]["decode_tokens_per_second"] = serde_json::json!(57_700.0);
    generate[2]["roofline"]["step_seconds"] = serde_json::json!(0.01);
    std::fs::write(measured.join("generate.json"), generate.to_string()).expect("w");
    own[0]["roofline"]["decode_tokens_per_second"] = serde_json::json!(148_300.0);
    std::fs::write(measured.join("generate-eval.json"), own.to_string()).expect("w");
    let rows = plan();
    assert_eq!(rows_there(&rows), (Some(245.0), Some(249.0)));
    let capped = f("train_hours")
        + (f("sample_tokens") / rate_at(0.25, 245.0, rollout_context)
            + f("eval_tokens") / rate_at(0.5, 249.0, eval_context))
            / 3600.0;
    assert!((carried_hours(&rows) / capped - 1.0).abs() < 1e-9);
    let md = std::fs::read_to_string(dir.path().join("paper-plan.md")).expect("md");
    assert!(
        md.contains("of the 143771 MiB") && md.contains("| 245 / 249 |"),
        "{md}"
    );
    // A measurement over an FP8 cache (its roofline counts one byte an element) is carried at
    // one byte an element, and its pool holds twice the positions: 33,928 blocks, 491 rows of
    // 69 blocks at the rollouts' context.
    generate[2]["roofline"]["kv_elem_bytes"] = serde_json::json!(1);
    std::fs::write(measured.join("generate.json"), generate.to_string()).expect("w");
    let rows = plan();
    assert_eq!(rows_there(&rows), (Some(491.0), Some(249.0)));
    let fp8_rate = 0.25 * 3_000e9 * 491.0
        / (2.0 * 1_720_574_976.0 + 491.0 * rollout_context * per_position / 2.0);
    let fp8 = f("train_hours")
        + (f("sample_tokens") / fp8_rate + f("eval_tokens") / rate_at(0.5, 249.0, eval_context))
            / 3600.0;
    assert!((carried_hours(&rows) / fp8 - 1.0).abs() < 1e-9);
    // A PPO run's critic stays on the device too: its pool, beside twice the state, holds fewer
    // rows than GRPO's at the same contexts (the same length limits).
    let ppo = |rows: &[serde_json::Value]| {
        rows.iter()
            .find(|r| r["run"] == "qwen3-1.7b-ppo")
            .expect("ppo")["rollout_rows_at_paper_contexts"]
            .as_f64()
            .expect("rows")
    };
    assert!(ppo(&rows) < 491.0, "{}", ppo(&rows));
    // A GPU whose pool holds no row at those contexts carries nothing.
    std::fs::write(
        measured.join("device.txt"),
        "== suite on a small GPU, 580.159.04, 4000 MiB\n",
    )
    .expect("w");
    let rows = plan();
    assert_eq!(rows_there(&rows), (None, None));
    assert!(rows
        .iter()
        .all(|r| r["gpu_hours_at_paper_contexts"].is_null()));
    // Malformed input: exit 2 and what it said, nothing written.
    let refused = || {
        let out = dir.path().join("bad");
        let bad = acpo(
            &[
                "bench",
                "paper-plan",
                "--measured",
                measured.to_str().expect("u"),
                "--out",
                out.to_str().expect("u"),
            ],
            repo(),
        );
        assert_eq!(bad.status.code(), Some(2));
        assert!(!out.exists());
        String::from_utf8_lossy(&bad.stderr).into_owned()
    };
    // a device.txt without a suite header, named
    std::fs::write(measured.join("device.txt"), "143771 MiB\n").expect("w");
    let err = refused();
    assert!(err.contains("device.txt"), "{err}");
    std::fs::remove_file(measured.join("device.txt")).expect("rm");
    // an element size no cache has, the file and the field named
    generate[2]["roofline"]["kv_elem_bytes"] = serde_json::json!(3);
    std::fs::write(measured.join("generate.json"), generate.to_string()).expect("w");
    let err = refused();
    assert!(
        err.contains("generate.json") && err.contains("kv_elem_bytes"),
        "{err}"
    );
}

#[test]
fn bench_memory_plan_fills_the_cuda_doc_with_every_paper_run() {
    let dir = tempfile::tempdir().expect("tempdir");
    let doc = dir.path().join("doc.md");
    std::fs::write(
        &doc,
        "x\n<!-- begin: memory-plan.md -->\nold\n<!-- end: memory-plan.md -->\n",
    )
    .expect("doc");
    let out = acpo(
        &[
            "bench",
            "memory-plan",
            "--out",
            dir.path().to_str().expect("utf8"),
            "--doc",
            doc.to_str().expect("utf8"),
        ],
        repo(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&doc).expect("doc");
    assert!(!text.contains("old"));
    // 16 runs, one row each; the committed docs/CUDA.md table is this command's output.
    assert_eq!(text.lines().filter(|l| l.starts_with("| qwen")).count(), 16);
    let shipped = std::fs::read_to_string(repo().join("docs/CUDA.md")).expect("CUDA.md");
    let table = std::fs::read_to_string(dir.path().join("memory-plan.md")).expect("md");
    assert!(
        shipped.contains(table.trim_end()),
        "docs/CUDA.md's memory table is stale: rerun `acpo bench memory-plan --doc docs/CUDA.md`"
    );
}

/// docs/CUDA.md's predicted train-step memory (issue #44) is `acpo bench memory-predict` of the
/// committed CPU traces (results/cpu-memory), and it says whether the 2 × 9,220 target holds.
#[test]
fn bench_memory_predict_of_the_committed_traces_is_the_cuda_doc_block() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = acpo(
        &[
            "bench",
            "memory-predict",
            "--measured",
            "results/cpu-memory",
            "--out",
            dir.path().to_str().expect("utf8"),
        ],
        repo(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = std::fs::read_to_string(dir.path().join("memory-predicted.md")).expect("md");
    for row in [
        "| 2 × 2048 | all",
        "| 2 × 9220 | all",
        "| 2 × 9220 | no flash",
        "| 2 × 9220 | all, each layer's backward by hand",
    ] {
        assert!(table.contains(row), "no row `{row}`:\n{table}");
    }
    assert!(table.contains("Target (issue #44)"), "{table}");
    assert!(table.contains("Target (issue #59)"), "{table}");
    let shipped = std::fs::read_to_string(repo().join("docs/CUDA.md")).expect("CUDA.md");
    assert!(
        shipped.contains(table.trim_end()),
        "docs/CUDA.md's predicted memory is stale: rerun `just memory-predict`"
    );
    let none = acpo(&["bench", "memory-predict"], repo());
    assert_eq!(
        none.status.code(),
        Some(2),
        "no --measured is a usage error"
    );
    // A folder without traces, and a report that is not a train step's, are refused by name.
    let bad = tempfile::tempdir().expect("tempdir");
    let predict = |measured: &Path| {
        acpo(
            &[
                "bench",
                "memory-predict",
                "--measured",
                measured.to_str().expect("utf8"),
                "--out",
                dir.path().to_str().expect("utf8"),
            ],
            repo(),
        )
    };
    let empty = predict(bad.path());
    assert_eq!(empty.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&empty.stderr).contains("no traced run"));
    std::fs::create_dir(bad.path().join("x")).expect("mkdir");
    std::fs::write(bad.path().join("x/train-step.json"), "[]").expect("write");
    let wrong = predict(bad.path());
    assert_eq!(wrong.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(
        stderr.contains("x/train-step.json") && stderr.contains("0 measurements"),
        "{stderr}"
    );
}

/// docs/CUDA.md's predicted decode attention times (issue #57) are `acpo bench decode-predict`
/// of the committed GPU runs: the pipelined kernel's bytes at each GPU's measured copy rate (the
/// H100's 2,573 GB/s, the H200's 3,773), beside the split-K kernel the H200 timed.
#[test]
fn bench_decode_predict_of_the_committed_gpu_runs_is_the_cuda_doc_block() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = acpo(
        &[
            "bench",
            "decode-predict",
            "--measured",
            "results/gpu",
            "--out",
            dir.path().to_str().expect("utf8"),
        ],
        repo(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = std::fs::read_to_string(dir.path().join("decode-predicted.md")).expect("md");
    for part in [
        "H100 at 2,573 GB/s",
        "H200 at 3,773 GB/s",
        "| 1 × 8,192 |",
        "| 64 × 1,025 |",
        "| 64 × 2,048 |",
        "341 µs",
    ] {
        assert!(table.contains(part), "no `{part}`:\n{table}");
    }
    let shipped = std::fs::read_to_string(repo().join("docs/CUDA.md")).expect("CUDA.md");
    assert!(
        shipped.contains(table.trim_end()),
        "docs/CUDA.md's predicted decode times are stale: rerun `just decode-predict`"
    );
    // and the suite's paged sampling runs at each GPU's pool, one row per run and GPU
    let sampling = std::fs::read_to_string(dir.path().join("sampling-predicted.md")).expect("md");
    for run in acpo::perf::sampling::SUITE_RUNS {
        for gpu in ["NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"] {
            let row = format!("| `{}`", run.folder);
            assert!(
                sampling
                    .lines()
                    .any(|l| l.starts_with(&row) && l.contains(&format!("| {gpu} |"))),
                "no row of {} on {gpu}:\n{sampling}",
                run.folder
            );
        }
    }
    assert!(
        shipped.contains(sampling.trim_end()),
        "docs/CUDA.md's predicted sampling runs are stale: rerun `just decode-predict`"
    );
    let none = acpo(&["bench", "decode-predict"], repo());
    assert_eq!(
        none.status.code(),
        Some(2),
        "no --measured is a usage error"
    );
    let empty = tempfile::tempdir().expect("tempdir");
    let nothing = acpo(
        &[
            "bench",
            "decode-predict",
            "--measured",
            empty.path().to_str().expect("utf8"),
            "--out",
            dir.path().to_str().expect("utf8"),
        ],
        repo(),
    );
    assert_eq!(nothing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&nothing.stderr).contains("no GPU run with a measured copy rate"),
        "{}",
        String::from_utf8_lossy(&nothing.stderr)
    );
}

/// docs/CUDA.md's predicted tensor-core attention times are `acpo bench
/// attention-predict` of the committed GPU runs: the model fitted to the kernels the H200 timed
/// (5.015 / 13.614 ms at 2 × 9,220), and a folder without timed kernels is a usage error.
#[test]
fn bench_attention_predict_of_the_committed_gpu_runs_is_the_cuda_doc_block() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |measured: &str| {
        acpo(
            &[
                "bench",
                "attention-predict",
                "--measured",
                measured,
                "--out",
                dir.path().to_str().expect("utf8"),
            ],
            repo(),
        )
    };
    let out = run("results/gpu");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = std::fs::read_to_string(dir.path().join("attention-predicted.md")).expect("md");
    for part in [
        "| 2 × 2,048 |",
        "| 2 × 9,220 |",
        "5.015 / 13.614 ms",
        "NVIDIA-H200-20261126",
    ] {
        assert!(table.contains(part), "no `{part}`:\n{table}");
    }
    let shipped = std::fs::read_to_string(repo().join("docs/CUDA.md")).expect("CUDA.md");
    assert!(
        shipped.contains(table.trim_end()),
        "docs/CUDA.md's predicted attention times are stale: rerun `just attention-predict`"
    );
    let empty = tempfile::tempdir().expect("tempdir");
    let nothing = run(empty.path().to_str().expect("utf8"));
    assert_eq!(nothing.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&nothing.stderr).contains("no flash_kernels_check.log"),
        "{}",
        String::from_utf8_lossy(&nothing.stderr)
    );
}

#[test]
fn train_from_the_command_line_refuses_to_overwrite_and_resumes() {
    let dir = tempfile::tempdir().expect("tempdir");
    // The manifest's model.init (paths relative to the working directory) creates the model.
    copy_experiments(dir.path());
    let manifest = repo().join("experiments/smoke/smoke-grpo-ac.yaml");
    let m = manifest.to_str().expect("u");
    let out = acpo(
        &["train", m, "--out", "results", "--max-steps", "1"],
        dir.path(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("trained 1 of 3 steps"));
    let out = acpo(&["train", m, "--out", "results"], dir.path());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--resume"));
    let out = acpo(&["train", m, "--out", "results", "--resume"], dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("resumed from step 1; now at step 3 of 3")
    );
    let bad = acpo(&["train", "no-such.yaml"], dir.path());
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no-such.yaml"));
}

#[test]
fn reproduce_table1_at_smoke_scale_end_to_end_then_from_a_verified_archive() {
    let dir = tempfile::tempdir().expect("tempdir");
    copy_experiments(dir.path());
    let out = acpo(&["reproduce", "table1", "--scale", "smoke"], dir.path());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table =
        std::fs::read_to_string(dir.path().join("results/smoke/table1.md")).expect("table1.md");
    for method in ["| PPO |", "| PPO-AC |", "| GRPO |", "| GRPO-AC |"] {
        assert!(
            table
                .replace("**", "")
                .contains(method.trim_end_matches(" |")),
            "{method} missing:\n{table}"
        );
    }
    assert!(
        dir.path()
            .join("models/smoke-qwen3-tiny/config.json")
            .exists(),
        "model.init created the smoke model"
    );
    let again = acpo(&["reproduce", "speedup", "--scale", "smoke"], dir.path());
    assert!(again.status.success());
    assert_eq!(
        String::from_utf8_lossy(&again.stdout)
            .matches("finished earlier, reused")
            .count(),
        4
    );

    let runs: Vec<String> = std::fs::read_dir(dir.path().join("results/smoke"))
        .expect("ls")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_dir())
        .map(|p| p.to_string_lossy().to_string())
        .collect();
    assert_eq!(runs.len(), 4);
    let mut args = vec!["archive"];
    args.extend(runs.iter().map(String::as_str));
    args.extend(["--out", "smoke.tar.gz"]);
    assert!(acpo(&args, dir.path()).status.success());
    let from = acpo(
        &[
            "reproduce",
            "table1",
            "--scale",
            "smoke",
            "--from",
            "smoke.tar.gz",
        ],
        dir.path(),
    );
    assert!(
        from.status.success(),
        "{}",
        String::from_utf8_lossy(&from.stderr)
    );
    assert!(String::from_utf8_lossy(&from.stdout).contains("OK:"));
    let mut bytes = std::fs::read(dir.path().join("smoke.tar.gz")).expect("read");
    let n = bytes.len();
    bytes[n / 2] ^= 0x55;
    std::fs::write(dir.path().join("bad.tar.gz"), bytes).expect("write");
    let bad = acpo(
        &[
            "reproduce",
            "table1",
            "--scale",
            "smoke",
            "--from",
            "bad.tar.gz",
        ],
        dir.path(),
    );
    assert_eq!(
        bad.status.code(),
        Some(1),
        "a corrupt archive is a failed check"
    );
    // Two seeds: the four seed-1 runs are reused, four seed-2 runs train, and the report pairs
    // them by seed (seeds.md) while Table 1 stays seed 1's.
    let table_before =
        std::fs::read_to_string(dir.path().join("results/smoke/table1.md")).expect("table1.md");
    let seeds = acpo(
        &["reproduce", "table1", "--scale", "smoke", "--seeds", "2"],
        dir.path(),
    );
    assert!(
        seeds.status.success(),
        "{}",
        String::from_utf8_lossy(&seeds.stderr)
    );
    let stdout = String::from_utf8_lossy(&seeds.stdout);
    assert_eq!(
        stdout.matches("finished earlier, reused").count(),
        4,
        "{stdout}"
    );
    assert_eq!(stdout.matches("(seed 2): training").count(), 4, "{stdout}");
    let pairs =
        std::fs::read_to_string(dir.path().join("results/smoke/seeds.md")).expect("seeds.md");
    for pair in ["| PPO | 2 (1–2) |", "| GRPO | 2 (1–2) |"] {
        assert!(pairs.contains(pair), "{pair} missing:\n{pairs}");
    }
    assert_eq!(
        std::fs::read_to_string(dir.path().join("results/smoke/table1.md")).expect("table1.md"),
        table_before
    );
    let zero = acpo(
        &["reproduce", "table1", "--scale", "smoke", "--seeds", "0"],
        dir.path(),
    );
    assert_eq!(zero.status.code(), Some(2), "--seeds 0 is bad input");
}

/// `acpo model logprobs`: teacher-forced log-probabilities and entropies agree with those of
/// transformers' logits (tests/fixtures/model_reference.json, computed here in f64), the input
/// errors name the line.
#[test]
fn model_logprobs_match_transformers() {
    let r = super::model::reference();
    let ids = super::model::ids_of(&r["input_ids"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let input = dir.path().join("ids.jsonl");
    let lines: Vec<String> = ids
        .iter()
        .map(|row| serde_json::json!({ "ids": row }).to_string())
        .collect();
    std::fs::write(&input, lines.join("\n") + "\n").expect("write");
    let output = dir.path().join("scored.jsonl");
    let fixture = repo().join("tests/fixtures/tiny-qwen3");
    let args = [
        "model",
        "logprobs",
        "--model",
        fixture.to_str().expect("u"),
        "--input",
        input.to_str().expect("u"),
        "--output",
        output.to_str().expect("u"),
    ];
    let out = acpo(&args, repo());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let logits = super::model::reference_logits(&r, "tiny-qwen3");
    let v = logits.len() / (ids.len() * ids[0].len());
    let scored: Vec<serde_json::Value> = std::fs::read_to_string(&output)
        .expect("read")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    for (b, row) in ids.iter().enumerate() {
        for i in 0..row.len() - 1 {
            let z: Vec<f64> = logits[(b * row.len() + i) * v..(b * row.len() + i + 1) * v]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + z.iter().map(|x| (x - m).exp()).sum::<f64>().ln();
            let lp = z[row[i + 1] as usize] - lse;
            let ent: f64 = -z.iter().map(|x| (x - lse).exp() * (x - lse)).sum::<f64>();
            let got_lp = scored[b]["log_probs"][i].as_f64().expect("lp");
            let got_ent = scored[b]["entropy"][i].as_f64().expect("entropy");
            assert!(
                (got_lp - lp).abs() < 1e-4,
                "row {b} pos {i}: log-prob {got_lp} vs {lp}"
            );
            assert!(
                (got_ent - ent).abs() < 1e-4,
                "row {b} pos {i}: entropy {got_ent} vs {ent}"
            );
        }
    }
    std::fs::write(&input, "{\"ids\": [1]}\n").expect("write");
    let out = acpo(&args, repo());
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ids.jsonl:1"));
}

/// The GPU suite samples as many rows as qwen3-1.7b-grpo's step (`trainer.batch_size` ×
/// `rollout.n`) and whole evaluations (a multiple of `eval.k`) at the benchmarks' mean prompt
/// (the plan's `EVAL_PROMPT_TOKENS`), every prompt distinct; each paged run is the one
/// `acpo bench decode-predict` predicts (`perf::sampling::SUITE_RUNS`), its command the paged
/// run alone over the cache the prediction counts, and on the H200 its time limit covers the
/// predicted decode steps with the cache at the split-K kernel's rate, with 10 s to spare.
#[test]
fn the_gpu_suite_samples_at_the_paper_run_s_rows_and_prompts() {
    let suite = std::fs::read_to_string(repo().join("tools/gpu/suite.sh")).expect("suite");
    let exp =
        acpo::manifest::Experiment::load(&repo().join("experiments/paper/qwen3-1.7b-grpo.yaml"))
            .expect("manifest");
    // The first assignment of each: the GPU's (a dry run's toy shapes come after).
    let flags = |array: &str| -> Vec<String> {
        let at = suite
            .find(&format!("    {array}=(--batch"))
            .unwrap_or_else(|| panic!("{array} in suite.sh"));
        let end = at + suite[at..].find(')').expect("the array ends");
        suite[at..end]
            .split_once("=(")
            .expect("an array")
            .1
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let value = |words: &[String], flag: &str| -> usize {
        let i = words
            .iter()
            .position(|w| w == flag)
            .unwrap_or_else(|| panic!("{flag} in {words:?}"));
        words[i + 1].parse().expect("a number")
    };
    // `--batch "${SUITE_TAIL_BATCH:-1024}"`: the default of a flag's variable
    let default_of = |words: &[String], flag: &str| -> usize {
        let i = words
            .iter()
            .position(|w| w == flag)
            .unwrap_or_else(|| panic!("{flag} in {words:?}"));
        words[i + 1]
            .split(":-")
            .nth(1)
            .and_then(|d| d.trim_end_matches(['}', '"']).parse().ok())
            .unwrap_or_else(|| panic!("a default in {}", words[i + 1]))
    };
    let default = |words: &[String]| default_of(words, "--batch");
    let rollouts = flags("tail_shape");
    assert_eq!(default(&rollouts), exp.trainer.batch_size * exp.rollout.n);
    let evals = flags("eval_shape");
    assert_eq!(default(&evals) % exp.eval.sampling.n, 0);
    assert_eq!(
        value(&evals, "--prompt-len") as f64,
        acpo::perf::plan::EVAL_PROMPT_TOKENS
    );
    // and as `acpo bench decode-predict` predicts them (`perf::sampling::SUITE_RUNS`)
    let rates = acpo::perf::decode::copy_rates(&repo().join("results/gpu")).expect("rates");
    let cfg =
        acpo::model::QwenConfig::load(&repo().join("experiments/paper/configs/qwen3-1.7b.json"))
            .expect("config");
    let predicted = acpo::perf::sampling::predict(&cfg, &rates);
    for run in acpo::perf::sampling::SUITE_RUNS {
        let (words, array) = if run.folder == "generate-eval" {
            (&evals, "eval_shape")
        } else {
            (&rollouts, "tail_shape")
        };
        assert_eq!(
            (
                default(words),
                value(words, "--group"),
                value(words, "--prompt-len"),
                default_of(words, "--new-tokens")
            ),
            (run.rows, run.group, run.prompt_len, run.new_tokens),
            "{}",
            run.folder
        );
        // the run's command: the paged run alone, over an FP8 cache where the prediction's is
        let out = format!("--out \"$res/{}\"", run.folder);
        let at = suite.find(&out).unwrap_or_else(|| panic!("{}", run.folder));
        let command = &suite[suite[..at].rfind("    step ").expect("its step")..at];
        assert!(command.contains("--long-tail --paged-kv") && command.contains("--paged-only"));
        assert!(
            command.contains(&format!("\"${{{array}[@]}}\"")),
            "{command}"
        );
        // `step "NAME" LIMIT LOG …`: the limit after the name
        let limit: f64 = command
            .split('"')
            .nth(2)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a limit in {command}"));
        let h200 = predicted
            .iter()
            .find(|p| p.run.folder == run.folder && p.device == "NVIDIA-H200")
            .expect("predicted on the H200");
        let split_k = h200
            .split_k_seconds
            .expect("the H200 timed the split-K kernel");
        assert!(
            split_k + 10.0 <= limit,
            "{}: {split_k:.1} s in {limit} s",
            run.folder
        );
        assert_eq!(
            command.contains("--kv-cache fp8"),
            run.kv_elem == 1,
            "{command}"
        );
        assert!(!command.contains("--max-batch"), "{command}");
    }
}

/// `tools/gpu/plan.sh` (`just gpu-plan DIR`) on the H200 run's committed rates, from another
/// directory: the next numbered call folder, the plan `acpo bench paper-plan` makes of the
/// trainer's step and the sampling run, the same bytes as the committed 6-plan; a second call
/// takes the next number (call 10 after call 9) and the paged runs' rows (the rollouts' and the
/// evaluations'), and a missing directory is refused.
#[test]
fn gpu_plan_script_costs_a_runs_rates_into_its_next_call_folder() {
    let run = repo().join("results/gpu/NVIDIA-H200-20261126");
    let dir = tempfile::tempdir().expect("tempdir");
    let root = dir.path().join("NVIDIA-H200-20261126");
    for (from, to) in [
        (
            "1-suite/gpu-suite/paper-9220/train-step.json",
            "1-suite/gpu-suite/paper-9220",
        ),
        ("1-suite/gpu-suite/summary.txt", "1-suite/gpu-suite"),
        ("2-decode/gpu-suite/summary.txt", "2-decode/gpu-suite"),
        (
            "2-decode/gpu-suite/generate-paper/generate.json",
            "2-decode/gpu-suite/generate-paper",
        ),
        // the step by hand, faster: not the default's rate, its own plan's
        (
            "1-suite/gpu-suite/paper-9220/train-step.json",
            "1-suite/gpu-suite/paper-9220-by-hand",
        ),
    ] {
        std::fs::create_dir_all(root.join(to)).expect("mkdir");
        let name = Path::new(from).file_name().expect("name");
        std::fs::copy(run.join(from), root.join(to).join(name)).expect("copy");
    }
    let faster = root.join("1-suite/gpu-suite/paper-9220-by-hand/train-step.json");
    let text = std::fs::read_to_string(&faster).expect("read");
    std::fs::write(
        &faster,
        text.replace("\"tokens_per_second\": ", "\"tokens_per_second\": 9"),
    )
    .expect("w");
    std::fs::create_dir(root.join("9-empty")).expect("mkdir");
    let plan = |dir: &Path| {
        std::process::Command::new("bash")
            .arg(repo().join("tools/gpu/plan.sh"))
            .arg(dir)
            .env("ACPO_BIN", env!("CARGO_BIN_EXE_acpo"))
            .current_dir(std::env::temp_dir())
            .output()
            .expect("bash")
    };
    let out = plan(&root);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for file in [
        "paper-plan.json",
        "paper-plan.md",
        "train-step.json",
        "generate.json",
        "device.txt",
    ] {
        assert_eq!(
            std::fs::read(root.join("10-plan/measured").join(file)).expect("made"),
            std::fs::read(run.join("6-plan/measured").join(file)).expect("committed"),
            "{file}"
        );
    }
    // The step by hand, which a run takes with `model.layer_backward: by-hand`: a plan of its
    // own beside the default's, from its rate and the same sampling rates, and fewer hours.
    let by_hand = root.join("10-plan/by-hand");
    let rate = |dir: &Path| -> f64 {
        let rows: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.join("train-step.json")).expect("r"))
                .expect("json");
        rows[0]["tokens_per_second"].as_f64().expect("a rate")
    };
    let faster_rows: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&faster).expect("r")).expect("json");
    let faster_rate = faster_rows[0]["tokens_per_second"]
        .as_f64()
        .expect("a rate");
    assert!((rate(&by_hand) / faster_rate - 1.0).abs() < 1e-12);
    assert!(rate(&by_hand) > 5.0 * rate(&root.join("10-plan/measured")));
    for file in ["generate.json", "device.txt"] {
        assert_eq!(
            std::fs::read(by_hand.join(file)).expect("copied"),
            std::fs::read(root.join("10-plan/measured").join(file)).expect("made"),
            "{file}"
        );
    }
    let grpo_hours = |dir: &Path| -> f64 {
        let rows: Vec<serde_json::Value> =
            serde_json::from_slice(&std::fs::read(dir.join("paper-plan.json")).expect("plan"))
                .expect("json");
        let row = rows
            .iter()
            .find(|r| r["run"] == "qwen3-1.7b-grpo")
            .expect("grpo");
        row["gpu_hours"].as_f64().expect("hours")
    };
    assert!(grpo_hours(&by_hand) < grpo_hours(&root.join("10-plan/measured")));
    // no FP8 sampling run: no FP8 plan; nothing staged left behind
    assert!(!root.join("10-plan/fp8-kv").exists());
    let left: Vec<_> = std::fs::read_dir(&root)
        .expect("ls")
        .map(|e| e.expect("e").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(!root.join("10-plan/measured/generate-eval.json").exists());
    // Runs over the paged cache (here the paper-shape row, its shape renamed paged): the
    // rollouts' paged run alone (`--paged-only`, one row) is their rate, and at the
    // evaluations' shape (`generate-eval`) its paged row after the dense ones is theirs.
    let measured: serde_json::Value = serde_json::from_slice(
        &std::fs::read(run.join("2-decode/gpu-suite/generate-paper/generate.json")).expect("r"),
    )
    .expect("json");
    let paged_run = |dir: &str, dense: usize, tps: f64| {
        let mut row = measured[0].clone();
        row["shape"] = serde_json::json!(
            "1024 prompts of 1024, continuous batching over the paged KV cache, at most 9 at once"
        );
        row["tokens_per_second"] = serde_json::json!(tps);
        let mut rows = vec![measured[0].clone(); dense];
        rows.push(row);
        let at = root.join("1-suite/gpu-suite").join(dir);
        std::fs::create_dir_all(&at).expect("mkdir");
        std::fs::write(
            at.join("generate.json"),
            serde_json::to_string(&rows).expect("j"),
        )
        .expect("w");
    };
    paged_run("generate-long-tail-paged", 0, 7_000.0);
    paged_run("generate-eval", 2, 9_000.0);
    // a dense row after the paged one is not taken either
    let eval = root.join("1-suite/gpu-suite/generate-eval/generate.json");
    let mut rows: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(&eval).expect("r")).expect("json");
    rows.push(measured[0].clone());
    std::fs::write(&eval, serde_json::to_string(&rows).expect("j")).expect("w");
    let again = plan(&root);
    assert!(again.status.success());
    let rollouts: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.join("11-plan/measured/generate.json")).expect("rollouts' rate"),
    )
    .expect("json");
    assert_eq!(rollouts[0]["tokens_per_second"], 7_000.0);
    let taken: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.join("11-plan/measured/generate-eval.json")).expect("eval rate"),
    )
    .expect("json");
    assert_eq!(taken[0]["tokens_per_second"], 9_000.0);
    let md = std::fs::read_to_string(root.join("11-plan/measured/paper-plan.md")).expect("md");
    assert!(
        md.contains("and 9000 for the evaluations (") && !md.contains("the rollouts' rate"),
        "{md}"
    );
    // the GPU's memory from the header of the call that sampled, which caps the rows carried
    let device = std::fs::read_to_string(root.join("11-plan/measured/device.txt")).expect("device");
    assert!(
        device.contains("1-suite/gpu-suite/summary.txt")
            && device.contains("== suite on NVIDIA H200, 580.159.04, 143771 MiB"),
        "{device}"
    );
    let inputs = std::fs::read_to_string(root.join("11-plan/commands.txt")).expect("commands");
    assert!(
        inputs.contains("evaluations 1-suite/gpu-suite/generate-eval/generate.json"),
        "{inputs}"
    );
    // An FP8 plan only from an FP8 run of the bf16 rate's kind: the paper shape's FP8 run
    // beside a paged bf16 rate makes none (the two plans are set side by side), the paged FP8
    // run does.
    let fp8_run = |dir: &str, tps: f64| {
        let mut row = measured[0].clone();
        row["tokens_per_second"] = serde_json::json!(tps);
        let at = root.join("1-suite/gpu-suite").join(dir);
        std::fs::create_dir_all(&at).expect("mkdir");
        std::fs::write(
            at.join("generate.json"),
            serde_json::to_string(&[row]).expect("j"),
        )
        .expect("w");
    };
    fp8_run("generate-paper-fp8", 6_000.0);
    assert!(plan(&root).status.success());
    assert!(!root.join("12-plan/fp8-kv").exists());
    let inputs = std::fs::read_to_string(root.join("12-plan/commands.txt")).expect("commands");
    assert!(
        inputs
            .contains("no FP8 sampling run of the bf16 rate's kind (generate-long-tail-paged-fp8)"),
        "{inputs}"
    );
    paged_run("generate-long-tail-paged-fp8", 0, 8_000.0);
    assert!(plan(&root).status.success());
    let fp8: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.join("13-plan/fp8-kv/generate.json")).expect("the FP8 rate"),
    )
    .expect("json");
    assert_eq!(fp8[0]["tokens_per_second"], 8_000.0);
    // Malformed input: exit 2 naming the file, no plan folder made
    let eval = root.join("1-suite/gpu-suite/generate-eval/generate.json");
    for bad in [
        "null",
        "{not json",
        r#"[{"target": "cuda/bf16", "shape": "x"}]"#,
    ] {
        std::fs::write(&eval, bad).expect("w");
        let out = plan(&root);
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("generate-eval/generate.json"), "{bad}: {err}");
        assert!(!root.join("14-plan").exists(), "{bad}");
    }
    let missing = plan(&dir.path().join("absent"));
    assert_eq!(missing.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("is not a directory"));
}
