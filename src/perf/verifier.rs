//! `acpo bench verifier`: answers per second of the verifier on every benchmark's gold answers,
//! each as a boxed answer, an `Answer:` line and a wrong answer; the pairs are written out so
//! `tools/twins/bench_math_verify.py` times Math-Verify on the very same pairs. It also reports the most
//! work ([`verify::work`]) any of those answers needs, against the budget, and the slowest of
//! [`hostile_answers`], the inputs built to stall a verifier.

use std::path::{Path, PathBuf};
use std::time::Instant;

use super::{write_report, Result};
use crate::data::Benchmark;
use crate::data::{self, DataLocation};
use crate::rng::SplitMix64;
use crate::verify;

/// Short answers built to make a verifier work hard, with a gold each: products of factorials,
/// runs of postfix operators, nested `±` trees, power towers, huge numbers and long sums of
/// fractions, nested sets and lists, lists of huge powers (compared pairwise), deep fractions.
/// Deterministic; `n` of each family.
pub fn hostile_answers(n: usize) -> Vec<(String, String)> {
    fn pm(depth: usize) -> String {
        if depth == 0 {
            "1".into()
        } else {
            format!("({})\\pm({})", pm(depth - 1), pm(depth - 1))
        }
    }
    let mut rng = SplitMix64::new(0x5EED_A5F0);
    let mut pick = |lo: u64, hi: u64| lo + rng.next_u64() % (hi - lo + 1);
    let mut out = Vec::new();
    for _ in 0..n {
        let k = pick(2, 100) as usize;
        let f = format!("{}!", pick(500, 2000));
        out.push((vec![f.as_str(); k].join("*"), "3".into()));
        let op = if pick(0, 1) == 0 { "%" } else { "!" };
        out.push((
            format!("5{}", op.repeat(pick(60, 3000) as usize)),
            "3".into(),
        ));
        out.push((pm(pick(3, 10) as usize), "0".into()));
        let depth = pick(2, 12) as usize;
        out.push((
            format!(
                "{}{}",
                "2^{".repeat(depth),
                "9".to_string() + &"}".repeat(depth)
            ),
            "2".into(),
        ));
        out.push((
            format!(
                "({})^{{{}}}",
                "9".repeat(pick(10, 60) as usize),
                pick(1000, 20000)
            ),
            "1".into(),
        ));
        let digits = "7".repeat(pick(500, 1900) as usize);
        out.push((format!("{digits}*{digits}/{digits}+1"), digits.clone()));
        let terms: Vec<String> = (1..=pick(100, 400))
            .map(|k| format!("\\frac{{1}}{{{k}}}"))
            .collect();
        out.push((terms.join("+"), "7".into()));
        let nest = pick(5, 30) as usize;
        out.push((
            format!("{}1, 2{}", "\\{".repeat(nest), "\\}".repeat(nest)),
            format!("{}2, 1{}", "\\{".repeat(nest), "\\}".repeat(nest)),
        ));
        let items: Vec<String> = (0..64)
            .map(|i| format!("\\{{{i}, {}\\}}", 64 - i))
            .collect();
        let mut rev = items.clone();
        rev.reverse();
        out.push((items.join(", "), rev.join(", ")));
        let powers: Vec<String> = (0..pick(20, 60))
            .map(|i| format!("{}^{{{}}}", 2 + i % 7, 60_000 + i))
            .collect();
        out.push((powers.join(", "), "1, 2".into()));
        let frac = pick(10, 60) as usize;
        out.push((
            format!("{}1{}", "\\frac{1}{1+".repeat(frac), "}".repeat(frac)),
            "0.618".into(),
        ));
    }
    out.into_iter()
        .map(|(answer, gold)| (gold, format!("\\boxed{{{answer}}}")))
        .collect()
}

/// The inputs of Math-Verify's own hang reports, as (name, gold, response): #65's power tower,
/// which `parse` alone never finishes; the prose answer of its follow-up comment, both ways
/// round; and #63's nested logarithms (the response's opening) with a power-tower answer, whose
/// memory use crashed the machine despite the timeout.
pub fn math_verify_issue_inputs() -> Vec<(&'static str, String, String)> {
    let tower =
        r"\boxed{\dfrac{5^{\left(5^{\left(5^{\left(5^5\right)}\right)} - 4\right)} - 5}{16}}";
    let prose = "{@Neillier 1276915 4951077 ник增高人权 국 {1,1-3-10鼓励不停);5个_GENERAL2全校。 _HEADERS1 Orchestra}";
    let logs = r"To determine the largest real number \( x \) for which the expression \(\log_{2^5}(\log_{2^4}(\log_{2^3}(\log_{2^2}(\log_{2^1}x))))\) is defined, we need to ensure that each logarithm in the nested expression is defined and positive. So \( x > 2^{2^{2^{2^{2^{5}}}}} \) and the answer is \boxed{2^{2^{2^{2^{2^{5}}}}}}";
    vec![
        ("math-verify#65", "1".into(), tower.into()),
        (
            "math-verify#65-comment",
            "92.5857658508735".into(),
            prose.into(),
        ),
        (
            "math-verify#65-comment-swapped",
            prose.into(),
            r"\boxed{92.5857658508735}".into(),
        ),
        ("math-verify#63", "2^{4096}".into(), logs.into()),
    ]
}

/// Each benchmark's golds boxed, after `Answer:` (both correct) and boxed plus one (wrong):
/// (gold, response, correct as constructed).
fn constructed_pairs(data: &DataLocation) -> Result<Vec<(String, String, bool)>> {
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
    Ok(pairs)
}

/// The most work units a real answer needs (every pair, and DAPO-Math-17k's golds boxed),
/// and its gold.
fn most_work(pairs: &[(String, String, bool)], data: &DataLocation) -> Result<(u64, String)> {
    let mut golds: Vec<(String, String)> = pairs
        .iter()
        .map(|(g, r, _)| (g.clone(), r.clone()))
        .collect();
    for p in data::load(&data::dapo::SPEC, data)? {
        let r = format!("So the answer is \\boxed{{{}}}.", p.answer);
        golds.push((p.answer, r));
    }
    let (most, most_pair) = golds
        .iter()
        .map(|(g, r)| (verify::verify_metered(g, r).1.units, g))
        .max_by_key(|(u, _)| *u)
        .expect("invariant: the benchmarks are not empty");
    Ok((most, most_pair.clone()))
}

/// The hostile answers timed: (answers, seconds in all, the slowest's seconds and its first 60
/// characters, how many the budget cut short).
fn hostile_timing() -> (Vec<(String, String)>, f64, f64, String, usize) {
    let mut hostile = hostile_answers(8);
    hostile.extend(
        math_verify_issue_inputs()
            .into_iter()
            .map(|(_, g, r)| (g, r)),
    );
    let (mut slowest, mut slowest_answer, mut cut_short) = (0.0f64, String::new(), 0);
    let t_all = Instant::now();
    for (g, r) in &hostile {
        let t = Instant::now();
        let (_, spent) = verify::verify_metered(g, r);
        let dt = t.elapsed().as_secs_f64();
        if dt > slowest {
            (slowest, slowest_answer) = (dt, r.chars().take(60).collect());
        }
        cut_short += usize::from(spent.exhausted);
    }
    let hostile_seconds = t_all.elapsed().as_secs_f64();
    (hostile, hostile_seconds, slowest, slowest_answer, cut_short)
}

/// Times the verifier (best of `repeats`) and writes `verifier.{json,md}` and the pairs.
pub fn bench(data: &DataLocation, out: &Path, repeats: usize) -> Result<PathBuf> {
    if repeats == 0 {
        return Err(super::PerfError::NoRepeats);
    }
    let pairs = constructed_pairs(data)?;
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

    // The most work a real answer needs: every pair above, and DAPO-Math-17k's golds boxed.
    let (most, most_pair) = most_work(&pairs, data)?;
    let headroom = verify::work::BUDGET as f64 / most as f64;
    println!(
        "work: at most {most} units for a real answer (gold `{most_pair}`), budget {} = {headroom:.0}x that",
        verify::work::BUDGET
    );

    // The hostile answers: the slowest one, and how many end on the budget.
    let (hostile, hostile_seconds, slowest, slowest_answer, cut_short) = hostile_timing();
    println!(
        "hostile: {} answers in {hostile_seconds:.3} s, slowest {:.1} ms (`{slowest_answer}…`), {cut_short} cut short by the budget",
        hostile.len(),
        slowest * 1e3
    );

    let report = serde_json::json!({
        "pairs": pairs.len(), "seconds": best, "answers_per_second": rate, "as_constructed": as_constructed,
        "budget_units": verify::work::BUDGET, "most_units_real": most, "most_units_real_gold": most_pair,
        "hostile_answers": hostile.len(), "hostile_seconds": hostile_seconds,
        "hostile_slowest_seconds": slowest, "hostile_slowest": slowest_answer, "hostile_cut_short": cut_short,
    });
    write_report(out, "verifier.json", format!("{report:#}").as_bytes())?;
    write_report(
        out,
        "verifier.md",
        format!(
            "# acpo bench verifier\n\n{} pairs (4 benchmarks' golds x boxed / Answer: / wrong), best of {repeats}: {best:.3} s, **{rate:.0} answers/s**; {as_constructed} judged as constructed.\n\n\
             Work budget {} units per answer; the most a real answer needs (these pairs and DAPO-Math-17k's golds): {most} units ({headroom:.0}x headroom).\n\n\
             {} hostile answers (`perf::verifier::hostile_answers` and `math_verify_issue_inputs`): {hostile_seconds:.3} s in all, the slowest {:.1} ms, {cut_short} ended by the budget with an error verdict.\n\n\
             Compare with Math-Verify: `python3 tools/twins/bench_math_verify.py {}`\n",
            pairs.len(),
            verify::work::BUDGET,
            hostile.len(),
            slowest * 1e3,
            pairs_file.display()
        )
        .as_bytes(),
    )
}
