//! `acpo bench verifier`: answers per second of the verifier on every benchmark's gold answers,
//! each as a boxed answer, an `Answer:` line and a wrong answer; the pairs are written out so
//! `tools/bench_math_verify.py` times Math-Verify on the very same pairs.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{write_report, Result};
use crate::data::{self, DataLocation};
use crate::manifest::Benchmark;
use crate::verify;

/// Times the verifier (best of `repeats`) and writes `verifier.{json,md}` and the pairs.
pub fn bench(data: &DataLocation, out: &Path, repeats: usize) -> Result<PathBuf> {
    if repeats == 0 {
        return Err(super::PerfError::NoRepeats);
    }
    let mut pairs: Vec<(String, String, bool)> = Vec::new();
    for b in Benchmark::ALL {
        for p in data::load(data::spec(b), data)? {
            let g = p.answer;
            pairs.push((
                g.clone(),
                format!("Reasoning.\nSo the answer is \\boxed{{{g}}}."),
                true,
            ));
            pairs.push((g.clone(), format!("Reasoning.\nAnswer: {g}"), true));
            pairs.push((g.clone(), format!("\\boxed{{{g}+1}}"), false));
        }
    }
    let mut best = f64::INFINITY;
    let mut verdicts = Vec::new();
    for _ in 0..repeats {
        let t = Instant::now();
        verdicts = pairs
            .iter()
            .map(|(g, r, _)| verify::verify(g, r).correct)
            .collect();
        best = best.min(t.elapsed().as_secs_f64());
    }
    let as_constructed = verdicts
        .iter()
        .zip(&pairs)
        .filter(|(v, p)| **v == p.2)
        .count();
    let rate = pairs.len() as f64 / best;
    println!(
        "verifier: {} pairs in {best:.3} s = {rate:.0} answers/s; {as_constructed}/{} as constructed",
        pairs.len(),
        pairs.len()
    );
    let mut lines = String::new();
    for ((g, r, want), got) in pairs.iter().zip(&verdicts) {
        lines.push_str(
            &serde_json::json!({"gold": g, "response": r, "constructed": want, "acpo": got})
                .to_string(),
        );
        lines.push('\n');
    }
    let pairs_file = write_report(out, "verifier_pairs.jsonl", lines.as_bytes())?;
    let report = serde_json::json!({"pairs": pairs.len(), "seconds": best, "answers_per_second": rate, "as_constructed": as_constructed});
    write_report(out, "verifier.json", format!("{report:#}").as_bytes())?;
    write_report(
        out,
        "verifier.md",
        format!(
            "# acpo bench verifier\n\n{} pairs (4 benchmarks' golds x boxed / Answer: / wrong), best of {repeats}: {best:.3} s, **{rate:.0} answers/s**; {as_constructed} judged as constructed.\n\nCompare with Math-Verify: `python3 tools/bench_math_verify.py {}`\n",
            pairs.len(),
            pairs_file.display()
        )
        .as_bytes(),
    )
}
