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
//! steps of its canonical solution; the warm start (supervised fine-tune) learns from worked
//! solutions written in many styles (v3, issue #22): operands of a sum or product either way
//! round, a level-2 sum or difference also in two parts (tens, then units), and a drawn opener,
//! equals word, multiplication sign and joining mark. All are correct; together they give the
//! warm-started policy the entropy a pretrained one starts RL with ([`Item::style_entropy`]).
//! Evaluation problems never appear in the training set (excluded on generation, and tested).
//!
//! The data are fixed by [`DATA_SEED`], like a released dataset: a run's seed changes its
//! sampling and order, never the problems.

use std::collections::HashSet;

use super::Problem;
use crate::data::{Benchmark, PromptTemplate};
use crate::rng::SplitMix64;

/// Version of the generator; bump whenever any problem, solution or split changes.
/// v3: every problem has several worked solutions (styles), not one template (issue #22).
pub const VERSION: &str = "3";
/// The seed of the task's data (not of any run).
pub const DATA_SEED: u64 = 2025;
/// Training problems generated for the synthetic suite.
pub const TRAIN_SIZE: usize = 20_000;

/// One arithmetic step of a worked solution: `a op b = value`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Step {
    pub a: i64,
    pub op: Op,
    pub b: i64,
    pub value: i64,
}

/// The operations of the task; addition and multiplication may be written either way round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Add,
    Sub,
    Mul,
}

impl Step {
    fn new(a: i64, op: Op, b: i64) -> Self {
        let value = match op {
            Op::Add => a + b,
            Op::Sub => a - b,
            Op::Mul => a * b,
        };
        Step { a, op, b, value }
    }
}

/// One generated problem with its level and the steps of its canonical worked solution.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub problem: Problem,
    pub level: u32,
    /// The canonical solution path; the last step's value is the answer.
    pub steps: Vec<Step>,
}

/// The ways a worked solution may be written (issue #22: a pretrained model has many correct
/// ways to write one solution, and that is where the paper's policies start with entropy; one
/// template per problem left the warm-started policy near-deterministic). Each choice is drawn
/// uniformly and independently, so the warm start's maximum-likelihood policy spreads its mass
/// evenly over them and [`Item::style_entropy`] is its entropy over the choices.
const OPENERS: [&str; 6] = ["", "Work: ", "Steps: ", "Solve: ", "Compute: ", "Check: "];
const EQUALS: [&str; 3] = [" = ", " is ", " gives "];
const TIMES: [&str; 3] = [" \\times ", " * ", " \\cdot "];
const JOINS: [&str; 3] = [". ", ", ", "; "];

/// The choices of one written solution, drawn from a seed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Style(pub u64);

impl Item {
    /// The solution paths of this problem: the canonical one, with commuted operands, and, for a
    /// level-2 sum or difference, the same in two parts (tens, then units). Each is correct.
    pub fn paths(&self) -> Vec<Vec<Step>> {
        let mut out: Vec<Vec<Step>> = vec![Vec::new()];
        for s in &self.steps {
            let mut forms = vec![vec![*s]];
            let commutes = matches!(s.op, Op::Add | Op::Mul) && s.a != s.b;
            if commutes {
                forms.push(vec![Step {
                    a: s.b,
                    b: s.a,
                    ..*s
                }]);
            }
            if self.level == 2 && matches!(s.op, Op::Add | Op::Sub) && s.b % 10 != 0 {
                let (tens, units) = (s.b - s.b % 10, s.b % 10);
                let first = Step::new(s.a, s.op, tens);
                forms.push(vec![first, Step::new(first.value, s.op, units)]);
            }
            out = out
                .iter()
                .flat_map(|p| {
                    forms.iter().map(move |f| {
                        let mut q = p.clone();
                        q.extend(f);
                        q
                    })
                })
                .collect();
        }
        out
    }

    /// One worked solution in `style`, in the answer style the prompt template asks for:
    /// `Answer: N` on the last line (DAPO-style training prompts) or `\boxed{N}` (evaluation).
    pub fn solution(&self, template: PromptTemplate, style: Style) -> String {
        let mut rng = SplitMix64::from_key(&[DATA_SEED, style.0]);
        let mut d = Draw(&mut rng);
        let paths = self.paths();
        let path = &paths[d.int(0, paths.len() as i64 - 1) as usize];
        let mut work = d.pick(&OPENERS).to_string();
        for (i, s) in path.iter().enumerate() {
            if i > 0 {
                work.push_str(d.pick(&JOINS));
            }
            let op = match s.op {
                Op::Add => " + ",
                Op::Sub => " - ",
                Op::Mul => d.pick(&TIMES),
            };
            work.push_str(&format!("{}{op}{}{}{}", s.a, s.b, d.pick(&EQUALS), s.value));
        }
        self.closed(work, template)
    }

    /// The canonical solution: every choice the first of its kind.
    pub fn canonical_solution(&self, template: PromptTemplate) -> String {
        let work = self
            .steps
            .iter()
            .map(|s| {
                let op = match s.op {
                    Op::Add => " + ",
                    Op::Sub => " - ",
                    Op::Mul => TIMES[0],
                };
                format!("{}{op}{}{}{}", s.a, s.b, EQUALS[0], s.value)
            })
            .collect::<Vec<_>>()
            .join(JOINS[0]);
        self.closed(work, template)
    }

    /// `work` closed in the answer style `template` asks for.
    fn closed(&self, work: String, template: PromptTemplate) -> String {
        let answer = &self.problem.answer;
        match template {
            PromptTemplate::Boxed => format!("{work}. The answer is $\\boxed{{{answer}}}$."),
            PromptTemplate::Dapo | PromptTemplate::Answer | PromptTemplate::Raw => {
                format!("{work}.\nAnswer: {answer}")
            }
        }
    }

    /// Entropy, in nats, of the style choices of one solution (path, opener, and per step its
    /// equals word, multiplication sign and joining mark): what a policy that learned the worked
    /// solutions exactly has over a whole response. Divided by the response's length in tokens
    /// it is the design's floor for the warm start's entropy per token.
    pub fn style_entropy(&self) -> f64 {
        let paths = self.paths();
        let ln = |n: usize| (n as f64).ln();
        // Paths differ in their number of steps; average the per-step choices over them.
        let per_path: f64 = paths
            .iter()
            .map(|p| {
                p.iter()
                    .map(|s| {
                        ln(EQUALS.len())
                            + if s.op == Op::Mul {
                                ln(TIMES.len())
                            } else {
                                0.0
                            }
                    })
                    .sum::<f64>()
                    + ln(JOINS.len()) * (p.len() - 1) as f64
            })
            .sum::<f64>()
            / paths.len() as f64;
        ln(paths.len()) + ln(OPENERS.len()) + per_path
    }
}

/// A style for the `i`-th use of a solution under `seed`: the warm start draws one per example.
pub fn style(seed: u64, epoch: u64, index: usize) -> Style {
    Style(SplitMix64::from_key(&[seed, epoch, index as u64, 0x57]).next_u64())
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

/// One problem of `level`: its text and the steps of its canonical solution.
fn level_problem(rng: &mut SplitMix64, level: u32) -> (String, Vec<Step>) {
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
            (text, vec![Step::new(a, Op::Add, b)])
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
            let op = if add { Op::Add } else { Op::Sub };
            let text = match (word, add) {
                (true, true) => format!("{name} has {a} {thing} and buys {b} more. How many {thing} does {name} have now?"),
                (true, false) => format!("{name} has {a} {thing} and gives away {b}. How many {thing} are left?"),
                (false, true) => format!("What is ${a} + {b}$?"),
                (false, false) => format!("What is ${a} - {b}$?"),
            };
            (text, vec![Step::new(a, op, b)])
        }
        3 => {
            let (a, b, c) = (d.int(2, 12), d.int(2, 12), d.int(1, 50));
            let text = if word {
                format!("{name} has {a} boxes with {b} {thing} in each, and {c} more {thing}. How many {thing} does {name} have in total?")
            } else {
                format!("Compute ${a} \\times {b} + {c}$.")
            };
            let ab = Step::new(a, Op::Mul, b);
            (text, vec![ab, Step::new(ab.value, Op::Add, c)])
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
                vec![
                    Step::new(a, Op::Add, b),
                    Step::new(s, Op::Mul, c),
                    Step::new(sc, Op::Sub, dd),
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
        let (text, steps) = level_problem(&mut rng, level);
        let answer = steps.last().map_or(0, |s| s.value);
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
/// template the mini manifests use, and two of its worked solutions in each answer style.
pub fn tokenizer_corpus() -> Vec<String> {
    let mut out = Vec::new();
    for (index, item) in train_items().into_iter().enumerate() {
        for t in [PromptTemplate::Answer, PromptTemplate::Boxed] {
            out.push(super::render_prompt(t, &item.problem.problem));
            for k in 0..2 {
                out.push(item.solution(t, style(0, k, index)));
            }
        }
    }
    out
}
