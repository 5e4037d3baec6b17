//! Issue #47, items 10 and 12: every numeric flag of every command has a valid range and refuses
//! values outside it (exit 2, one message naming the flag), never replacing them silently. The
//! flags are found by walking clap's command tree of the binary's own `src/cli/args.rs` (included
//! here as it is), so a flag added later is walked too, and held to the same rule: 0, a huge
//! value, -1, inf and NaN are refused unless the flag says what they mean (listed below, with
//! why).

use std::any::TypeId;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[path = "../../src/cli/args.rs"]
#[allow(dead_code)]
mod args;

/// The longest one probe may take: a refused value is refused by the parser at once, and an
/// accepted one runs into a placeholder input (or, for `pmd`, runs its few seconds).
const MAX_TIME: Duration = Duration::from_secs(120);

/// Flags (by long name) for which 0 is in range, and what it means there.
const ZERO_MEANS: [(&str, &str); 4] = [
    ("seed", "a seed like any other"),
    ("step", "the evaluation before the first training step"),
    (
        "vocab-chunk",
        "log-probs from the logits by positions, unchunked",
    ),
    ("temperature", "greedy decoding"),
];

/// Flags for which a huge value is in range: a seed is any u64; a finite temperature, however
/// high, only flattens the distribution.
const ANY_SIZE: [&str; 2] = ["seed", "temperature"];

/// Arguments a command needs beyond its required ones before a flag's value can matter (clap
/// cannot say so: `--prompt` is required unless `--input` is given), and placeholders that keep
/// an accepted value from starting minutes of work (a benchmark of every built-in size).
fn extra(command: &[String], absent: &str) -> Vec<String> {
    let words: Vec<&str> = command.iter().map(String::as_str).collect();
    match words.as_slice() {
        ["generate"] => vec!["--prompt".into(), "2+2=".into()],
        ["bench"] => vec!["--config".into(), absent.into()],
        _ => Vec::new(),
    }
}

/// A numeric flag of a command.
struct Flag {
    command: Vec<String>,
    long: String,
    float: bool,
    /// The command's required arguments, filled with placeholders.
    required: Vec<String>,
}

/// Every leaf command of `cmd` (its words after `acpo`) with the clap command itself.
fn leaves(cmd: &clap::Command, path: Vec<String>, out: &mut Vec<(Vec<String>, clap::Command)>) {
    if cmd.has_subcommands() {
        for sub in cmd.get_subcommands() {
            let mut p = path.clone();
            p.push(sub.get_name().to_string());
            leaves(sub, p, out);
        }
    } else {
        out.push((path, cmd.clone()));
    }
}

/// The numeric flags of every command, each with a command line that parses with a valid value.
fn numeric_flags(absent: &Path) -> Vec<Flag> {
    let absent = absent.to_str().expect("utf8");
    let mut root = args::Cli::command_line();
    root.build();
    let mut commands = Vec::new();
    leaves(&root, Vec::new(), &mut commands);
    let mut out = Vec::new();
    for (words, cmd) in commands {
        let mut required = Vec::new();
        for a in cmd.get_arguments().filter(|a| a.is_required_set()) {
            let value = a
                .get_possible_values()
                .first()
                .map_or_else(|| absent.to_string(), |v| v.get_name().to_string());
            match a.get_long() {
                Some(long) => required.extend([format!("--{long}"), value]),
                None => required.push(value),
            }
        }
        required.extend(extra(&words, absent));
        for a in cmd.get_arguments() {
            let id = a.get_value_parser().type_id();
            let Some(long) = a.get_long() else { continue };
            if !args::is_numeric(a) {
                continue;
            }
            out.push(Flag {
                command: words.clone(),
                long: long.to_string(),
                float: id == TypeId::of::<f64>() || id == TypeId::of::<f32>(),
                required: required.clone(),
            });
        }
    }
    out
}

impl Flag {
    /// The command line with this flag set to `value`.
    fn line(&self, value: &str) -> Vec<String> {
        let mut v = self.command.clone();
        v.extend(self.required.iter().cloned());
        v.extend([format!("--{}", self.long), value.to_string()]);
        v
    }

    fn name(&self) -> String {
        format!("acpo {} --{}", self.command.join(" "), self.long)
    }

    /// The values probed, and whether each must be refused.
    fn probes(&self) -> Vec<(&'static str, bool)> {
        let zero_ok = ZERO_MEANS.iter().any(|(f, _)| *f == self.long);
        let huge_ok = ANY_SIZE.contains(&self.long.as_str());
        let huge = if self.float {
            "1e308"
        } else {
            "18446744073709551615"
        };
        vec![
            ("0", !zero_ok),
            (huge, !huge_ok),
            ("-1", true),
            ("inf", true),
            ("NaN", true),
        ]
    }
}

/// `acpo ARGS` parsed as the binary parses them ([`args::Cli::command_line`]).
fn parse<I: IntoIterator<Item = T>, T: Into<std::ffi::OsString> + Clone>(
    line: I,
) -> Result<clap::ArgMatches, clap::Error> {
    args::Cli::command_line().try_get_matches_from(line)
}

/// Runs the binary with `args` in `cwd`: its exit code and stderr; fails on a signal, a panic or
/// a run past [`MAX_TIME`].
fn run(args: &[String], cwd: &Path, what: &str) -> (i32, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_acpo"))
        .args(args)
        .current_dir(cwd)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("acpo runs");
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > MAX_TIME {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {MAX_TIME:?}: {args:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let mut stderr = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut stderr);
    }
    let code = status
        .code()
        .unwrap_or_else(|| panic!("{what}: killed by a signal: {args:?}: {stderr}"));
    assert!(
        matches!(code, 0..=2) && !stderr.contains("panicked"),
        "{what}: exit {code}: {args:?}: {stderr}"
    );
    (code, stderr)
}

/// The walk: every numeric flag of every command with 0, a huge value, -1, inf and NaN. A value
/// outside the flag's range is refused by the parser (checked in this process on the same clap
/// tree) and by the binary with exit 2 and one message naming the flag; a value in range runs
/// to an exit of 0, 1 or 2 without a panic, within the time limit.
#[test]
fn every_numeric_flag_refuses_values_outside_its_range() {
    let tmp = tempfile::tempdir().expect("tmp");
    let absent = tmp.path().join("absent");
    let flags = numeric_flags(&absent);
    assert!(
        flags.len() >= 25,
        "the walk found only {} numeric flags: is the command tree read?",
        flags.len()
    );
    let mut tried = 0;
    for flag in &flags {
        // The command line itself is sound: an in-range value parses.
        let ok = parse(std::iter::once("acpo".to_string()).chain(flag.line("1")));
        assert!(
            ok.is_ok(),
            "{}: the probe's command line does not parse: {ok:?}",
            flag.name()
        );
        for (value, must_refuse) in flag.probes() {
            let line = flag.line(value);
            let what = format!("{} {value}", flag.name());
            let parsed = parse(std::iter::once("acpo".to_string()).chain(line.clone()));
            assert_eq!(
                parsed.is_err(),
                must_refuse,
                "{what}: {} by its declared range",
                if must_refuse { "accepted" } else { "refused" }
            );
            let (code, stderr) = run(&line, tmp.path(), &what);
            tried += 1;
            if must_refuse {
                assert_eq!(code, 2, "{what}: {stderr}");
                assert!(
                    stderr.starts_with("error: invalid value")
                        && stderr.contains(&format!("--{}", flag.long))
                        && stderr.lines().filter(|l| l.starts_with("error")).count() == 1,
                    "{what}: not one message naming the flag: {stderr}"
                );
            }
        }
    }
    assert_eq!(tried, 5 * flags.len());
}

/// Item 12: `generate --temperature inf` is refused like NaN and negatives, naming the flag;
/// 0 (greedy) and finite temperatures from 0.01 pass the parser.
#[test]
fn generate_refuses_an_infinite_temperature() {
    for (value, ok) in [
        ("inf", false),
        ("+inf", false),
        ("-inf", false),
        ("infinity", false),
        ("NaN", false),
        ("-0.5", false),
        ("0.001", false),
        ("0", true),
        ("0.01", true),
        ("0.7", true),
    ] {
        let parsed = parse([
            "acpo",
            "generate",
            "--model",
            "m",
            "--prompt",
            "p",
            &format!("--temperature={value}"),
        ]);
        assert_eq!(parsed.is_ok(), ok, "{value}");
        if let Err(e) = parsed {
            let said = e.to_string();
            assert!(
                said.contains("--temperature") && said.contains("0 (greedy)"),
                "{said}"
            );
        }
    }
    let (code, stderr) = run(
        &[
            "generate".into(),
            "--model".into(),
            "m".into(),
            "--prompt".into(),
            "p".into(),
            "--temperature".into(),
            "inf".into(),
        ],
        Path::new(env!("CARGO_MANIFEST_DIR")),
        "generate --temperature inf",
    );
    assert_eq!(code, 2);
    assert!(stderr.contains("--temperature"), "{stderr}");
}

/// Item 10: `pipeline --micro-batch` is taken as given or refused: 0 by the parser, 3 and
/// 1,000,000 (which do not divide a divided mini-batch's 4 responses) naming the flag and the
/// count, where they were replaced by 4, 1 and 4 without a word; a divisor of it is kept.
#[test]
fn pipeline_refuses_a_micro_batch_that_does_not_divide_its_mini_batch() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().expect("tmp");
    let manifest = repo.join("experiments/paper/qwen3-1.7b-grpo.yaml");
    let text = std::fs::read_to_string(&manifest).expect("manifest");
    let derivation = |micro_batch| acpo::perf::pipeline::Derivation {
        divisor: 64,
        steps: 1,
        eval_limit: 1,
        tokenizer: Some(tmp.path().join("tokenizer")),
        configs: repo.join("experiments/paper/configs"),
        models: tmp.path().join("models"),
        config: None,
        device: None,
        kv_layout: None,
        layer_backward: None,
        micro_batch,
    };
    let (exp, _) =
        acpo::perf::pipeline::derive(&text, &manifest, &derivation(None)).expect("derived");
    let responses = exp.actor.mini_batch_size * exp.rollout.n;
    assert_eq!(responses, 4, "the premise: 64 / 64 prompts × 4");
    for mb in [3, 1_000_000, 8] {
        let err = acpo::perf::pipeline::derive(&text, &manifest, &derivation(Some(mb)))
            .expect_err("refused")
            .to_string();
        assert!(
            err.contains(&format!(
                "--micro-batch {mb} does not divide the 4 responses"
            )),
            "{err}"
        );
    }
    for mb in [1, 2, 4] {
        let (exp, _) =
            acpo::perf::pipeline::derive(&text, &manifest, &derivation(Some(mb))).expect("kept");
        assert_eq!(exp.actor.micro_batch_size, mb);
    }
    let configs = repo.join("experiments/paper/configs");
    for (mb, says) in [
        ("0", "invalid value '0' for '--micro-batch"),
        ("3", "--micro-batch 3 does not divide"),
        ("1000000", "--micro-batch 1000000 does not divide"),
    ] {
        let line: Vec<String> = [
            "pipeline",
            manifest.to_str().expect("u"),
            "--micro-batch",
            mb,
            "--configs",
            configs.to_str().expect("u"),
            "--results",
            tmp.path().join("r").to_str().expect("u"),
            "--models",
            tmp.path().join("models").to_str().expect("u"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let (code, stderr) = run(&line, tmp.path(), &format!("pipeline --micro-batch {mb}"));
        assert_eq!(code, 2, "{stderr}");
        assert!(stderr.contains(says), "{stderr}");
        assert!(!tmp.path().join("r").exists() && !tmp.path().join("models").exists());
    }
}
