//! A seeded synthetic task with verifiable integer answers, for the smoke and mini scales.
//!
//! Four difficulty levels (one-digit sums → two-step expressions with two-digit operands); the
//! training set mixes them, and the four benchmark twins have the paper's sizes and roles
//! (MATH500 easiest → AIME-like hardest), so weighted accuracy and Table 1 keep their shape.
//! Evaluation problems never appear in the training set (checked on generation).
//! Version 1; issue #8 refines the task and its difficulty ladder.

use std::collections::HashSet;

use super::Problem;
use crate::manifest::Benchmark;
use crate::rng::SplitMix64;

pub const VERSION: &str = "1";
/// Training problems generated for the synthetic suite.
pub const TRAIN_SIZE: usize = 20_000;

fn level_problem(rng: &mut SplitMix64, level: u32) -> (String, i64) {
    let mut r = |lo: i64, hi: i64| lo + (rng.next_u64() % (hi - lo + 1) as u64) as i64;
    match level {
        1 => {
            let (a, b) = (r(0, 9), r(0, 9));
            (format!("What is ${a} + {b}$?"), a + b)
        }
        2 => {
            let (a, b) = (r(10, 99), r(10, 99));
            if r(0, 1) == 0 {
                (format!("What is ${a} + {b}$?"), a + b)
            } else {
                (format!("What is ${a} - {b}$?"), a - b)
            }
        }
        3 => {
            let (a, b, c) = (r(2, 12), r(2, 12), r(1, 50));
            (format!("Compute ${a} \\times {b} + {c}$."), a * b + c)
        }
        _ => {
            let (a, b, c, d) = (r(10, 60), r(10, 60), r(2, 9), r(1, 99));
            (
                format!("Compute $({a} + {b}) \\times {c} - {d}$."),
                (a + b) * c - d,
            )
        }
    }
}

fn make(
    seed: u64,
    stream: u64,
    levels: &[u32],
    n: usize,
    exclude: &HashSet<String>,
    prefix: &str,
) -> Vec<Problem> {
    let mut rng = SplitMix64::from_key(&[seed, stream]);
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(n);
    let mut tries = 0usize;
    while out.len() < n && tries < n * 50 {
        tries += 1;
        let level = levels[(rng.next_u64() % levels.len() as u64) as usize];
        let (text, answer) = level_problem(&mut rng, level);
        if exclude.contains(&text) || !seen.insert(text.clone()) {
            continue;
        }
        out.push(Problem {
            id: format!("{prefix}/{}", out.len()),
            problem: text,
            answer: answer.to_string(),
        });
    }
    out
}

/// The training set of the synthetic suite.
pub fn train(seed: u64) -> Vec<Problem> {
    make(
        seed,
        0x7A1,
        &[1, 2, 3, 4],
        TRAIN_SIZE,
        &HashSet::new(),
        "synthetic-train",
    )
}

/// The twin of a paper benchmark: same size and role, disjoint from the training set.
pub fn benchmark(seed: u64, b: Benchmark) -> Vec<Problem> {
    let train: HashSet<String> = train(seed).into_iter().map(|p| p.problem).collect();
    let (stream, levels): (u64, &[u32]) = match b {
        Benchmark::Math500 => (0xB1, &[1, 2]),
        Benchmark::Minerva => (0xB2, &[2, 3]),
        Benchmark::Olympiadbench => (0xB3, &[3, 4]),
        Benchmark::AimeLike => (0xB4, &[4]),
    };
    make(
        seed,
        stream,
        levels,
        b.size(),
        &train,
        &format!("synthetic-{}", b.name()),
    )
}
