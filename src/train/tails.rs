//! r·Â by prompt difficulty (paper Section 3, the figure "r_t Â_t across prompts"): per-token
//! gradient coefficients of the policy update, bucketed by the pass rate of their prompt —
//! easy 70–100 %, medium 30–70 %, hard 0–30 % — as fixed-bin histograms (exact counts, so they
//! add across steps and runs, and the report can draw them without the raw values).

use serde::{Deserialize, Serialize};

/// Prompt difficulty from its pass rate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Difficulty {
    Easy = 0,
    Medium = 1,
    Hard = 2,
}

impl Difficulty {
    /// easy ≥ 0.7, medium ≥ 0.3, hard < 0.3 (the paper's 70–100 / 30–70 / 0–30 %).
    pub fn of(pass_rate: f64) -> Difficulty {
        if pass_rate >= 0.7 {
            Difficulty::Easy
        } else if pass_rate >= 0.3 {
            Difficulty::Medium
        } else {
            Difficulty::Hard
        }
    }
}

/// Bin edges: [−20, 20] in steps of 0.1, plus under/overflow (r·Â beyond ±20 is counted there).
pub const LO: f64 = -20.0;
pub const HI: f64 = 20.0;
pub const BINS: usize = 400;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    pub lo: f64,
    pub hi: f64,
    pub counts: Vec<u64>,
    pub underflow: u64,
    pub overflow: u64,
    pub count: u64,
    pub sum: f64,
    pub sum_sq: f64,
    pub min: f64,
    pub max: f64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            lo: LO,
            hi: HI,
            counts: vec![0; BINS],
            underflow: 0,
            overflow: 0,
            count: 0,
            sum: 0.0,
            sum_sq: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
        }
    }
}

impl Histogram {
    pub fn add(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        self.count += 1;
        self.sum += x;
        self.sum_sq += x * x;
        self.min = self.min.min(x);
        self.max = self.max.max(x);
        if x < self.lo {
            self.underflow += 1;
        } else if x >= self.hi {
            self.overflow += 1;
        } else {
            let i = ((x - self.lo) / (self.hi - self.lo) * BINS as f64) as usize;
            self.counts[i.min(BINS - 1)] += 1;
        }
    }
}

/// The r·Â histograms of one training step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Tails {
    pub step: usize,
    pub easy: Histogram,
    pub medium: Histogram,
    pub hard: Histogram,
    /// Prompts per bucket (easy, medium, hard).
    pub prompts: [usize; 3],
}

impl Tails {
    pub fn bucket(&mut self, d: Difficulty) -> &mut Histogram {
        match d {
            Difficulty::Easy => &mut self.easy,
            Difficulty::Medium => &mut self.medium,
            Difficulty::Hard => &mut self.hard,
        }
    }
}
