//! A seeded synthetic task with verifiable integer answers and worked solutions, for the smoke
//! and mini scales (issue #8).
//!
//! Four difficulty levels, each written either as an expression or as a word problem:
//!
//! | level | operands, steps                        | example                               |
//! |-------|----------------------------------------|---------------------------------------|
//! | 1     | one-digit sum, 1 step                  | `What is $3 + 5$?`                    |
//! | 2     | two-digit sum or difference, 1 step    | `What is $47 - 18$?`                  |
//! | 3     | a×b + c (a, b ≤ 12), 2 steps           | `Compute $7 \times 8 + 13$.`          |
//! | 4     | (a + b)×c − d (two-digit a, b), 3 steps | `Compute $(23 + 45) \times 3 - 17$.`  |
//!
//! The training set (DAPO's role) mixes all levels; the four benchmark twins have the paper's
//! sizes and roles, increasingly hard (MATH500: levels 1–2, Minerva: 2–3, OlympiadBench: 3–4,
//! AIME-like: 4), so weighted accuracy and Table 1 keep their shape. Every problem carries the
//! steps of its worked solution, which the warm start (supervised fine-tune) learns from.
//! Evaluation problems never appear in the training set (excluded on generation, and tested).
//!
//! The data are fixed by [`DATA_SEED`], like a released dataset: a run's seed changes its
//! sampling and order, never the problems.

use std::collections::HashSet;

use super::Problem;
use crate::manifest::{Benchmark, PromptTemplate};
use crate::rng::SplitMix64;

/// Version of the generator; bump whenever any problem, solution or split changes.
pub const VERSION: &str = "2";
/// The seed of the task's data (not of any run).
pub const DATA_SEED: u64 = 2025;
/// Training problems generated for the synthetic suite.
pub const TRAIN_SIZE: usize = 20_000;

/// One generated problem with its level and the steps of a worked solution.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub problem: Problem,
    pub level: u32,
    /// Each step is an equation `x op y = z`; the last `z` is the answer.
    pub steps: Vec<String>,
}

impl Item {
    /// The worked solution in the style the prompt template asks for: `Answer: N` on the last
    /// line (DAPO-style training prompts) or `\boxed{N}` (the evaluation prompt).
    pub fn solution(&self, template: PromptTemplate) -> String {
        let work = self.steps.join(". ");
        let answer = &self.problem.answer;
        match template {
            PromptTemplate::Boxed => format!("{work}. The answer is $\\boxed{{{answer}}}$."),
            PromptTemplate::Dapo | PromptTemplate::Answer | PromptTemplate::Raw => {
                format!("{work}.\nAnswer: {answer}")
            }
        }
    }
}

const NAMES: [&str; 8] = ["Sam", "Ann", "Lee", "Mia", "Tom", "Ada", "Ben", "Eva"];
const THINGS: [&str; 8] = [
    "apples", "pens", "coins", "books", "cards", "shells", "stamps", "marbles",
];

struct Draw<'a>(&'a mut SplitMix64);

impl Draw<'_> {
    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + (self.0.next_u64() % (hi - lo + 1) as u64) as i64
    }
    fn pick<'s>(&mut self, xs: &[&'s str]) -> &'s str {
        xs[(self.0.next_u64() % xs.len() as u64) as usize]
    }
}

/// One problem of `level`: (text, answer, solution steps).
fn level_problem(rng: &mut SplitMix64, level: u32) -> (String, i64, Vec<String>) {
    let mut d = Draw(rng);
    let word = d.int(0, 1) == 1;
    let (name, thing) = (d.pick(&NAMES), d.pick(&THINGS));
    match level {
        1 => {
            let (a, b) = (d.int(0, 9), d.int(0, 9));
            let text = if word {
                format!("{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?")
            } else {
                format!("What is ${a} + {b}$?")
            };
            (text, a + b, vec![format!("{a} + {b} = {}", a + b)])
        }
        2 => {
            let (a, b) = (d.int(10, 99), d.int(10, 99));
            let add = d.int(0, 1) == 0;
            // A word problem never takes away more than there is.
            let (a, b) = if !add && word && b > a {
                (b, a)
            } else {
                (a, b)
            };
            let (op, value) = if add { ("+", a + b) } else { ("-", a - b) };
            let text = match (word, add) {
                (true, true) => format!("{name} has {a} {thing} and buys {b} more. How many {thing} does {name} have now?"),
                (true, false) => format!("{name} has {a} {thing} and gives away {b}. How many {thing} are left?"),
                (false, _) => format!("What is ${a} {op} {b}$?"),
            };
            (text, value, vec![format!("{a} {op} {b} = {value}")])
        }
        3 => {
            let (a, b, c) = (d.int(2, 12), d.int(2, 12), d.int(1, 50));
            let text = if word {
                format!("{name} has {a} boxes with {b} {thing} in each, and {c} more {thing}. How many {thing} does {name} have in total?")
            } else {
                format!("Compute ${a} \\times {b} + {c}$.")
            };
            let ab = a * b;
            (
                text,
                ab + c,
                vec![
                    format!("{a} \\times {b} = {ab}"),
                    format!("{ab} + {c} = {}", ab + c),
                ],
            )
        }
        _ => {
            let (a, b, c) = (d.int(10, 60), d.int(10, 60), d.int(2, 9));
            let s = a + b;
            let sc = s * c;
            let dd = d.int(1, 99.min(sc - 1));
            let text = if word {
                format!("{name} has {a} red bags and {b} blue bags. Each bag holds {c} {thing}. {name} gives away {dd} {thing}. How many {thing} are left?")
            } else {
                format!("Compute $({a} + {b}) \\times {c} - {dd}$.")
            };
            (
                text,
                sc - dd,
                vec![
                    format!("{a} + {b} = {s}"),
                    format!("{s} \\times {c} = {sc}"),
                    format!("{sc} - {dd} = {}", sc - dd),
                ],
            )
        }
    }
}

fn make(
    stream: u64,
    levels: &[u32],
    n: usize,
    exclude: &HashSet<String>,
    prefix: &str,
) -> Vec<Item> {
    let mut rng = SplitMix64::from_key(&[DATA_SEED, stream]);
    let mut seen = HashSet::new();
    let mut out = Vec::with_capacity(n);
    let mut tries = 0usize;
    while out.len() < n && tries < n * 50 {
        tries += 1;
        let level = levels[(rng.next_u64() % levels.len() as u64) as usize];
        let (text, answer, steps) = level_problem(&mut rng, level);
        if exclude.contains(&text) || !seen.insert(text.clone()) {
            continue;
        }
        out.push(Item {
            problem: Problem {
                id: format!("{prefix}/{}", out.len()),
                problem: text,
                answer: answer.to_string(),
            },
            level,
            steps,
        });
    }
    out
}

/// The training set with worked solutions (the warm start reads the solutions, RL only the
/// problems and answers).
pub fn train_items() -> Vec<Item> {
    make(
        0x7A1,
        &[1, 2, 3, 4],
        TRAIN_SIZE,
        &HashSet::new(),
        "synthetic-train",
    )
}

/// The training set of the synthetic suite.
pub fn train() -> Vec<Problem> {
    train_items().into_iter().map(|i| i.problem).collect()
}

/// The levels a benchmark twin draws from.
pub fn levels(b: Benchmark) -> &'static [u32] {
    match b {
        Benchmark::Math500 => &[1, 2],
        Benchmark::Minerva => &[2, 3],
        Benchmark::Olympiadbench => &[3, 4],
        Benchmark::AimeLike => &[4],
    }
}

/// The twin of a paper benchmark, with solutions: same size and role, disjoint from training.
pub fn benchmark_items(b: Benchmark) -> Vec<Item> {
    let train: HashSet<String> = train_items()
        .into_iter()
        .map(|i| i.problem.problem)
        .collect();
    let stream = match b {
        Benchmark::Math500 => 0xB1,
        Benchmark::Minerva => 0xB2,
        Benchmark::Olympiadbench => 0xB3,
        Benchmark::AimeLike => 0xB4,
    };
    make(
        stream,
        levels(b),
        b.size(),
        &train,
        &format!("synthetic-{}", b.name()),
    )
}

/// The twin of a paper benchmark: same size and role, disjoint from the training set.
pub fn benchmark(b: Benchmark) -> Vec<Problem> {
    benchmark_items(b).into_iter().map(|i| i.problem).collect()
}

/// Text the mini scale's tokenizer is trained on: every training problem under each prompt
/// template the mini manifests use, and its worked solution in both answer styles.
pub fn tokenizer_corpus() -> Vec<String> {
    let mut out = Vec::new();
    for item in train_items() {
        for t in [PromptTemplate::Answer, PromptTemplate::Boxed] {
            out.push(super::render_prompt(t, &item.problem.problem));
            out.push(item.solution(t));
        }
    }
    out
}
