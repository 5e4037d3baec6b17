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
    /// None while empty (JSON has no infinities).
    pub min: Option<f64>,
    pub max: Option<f64>,
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
            min: None,
            max: None,
        }
    }
}

impl Histogram {
    /// Adds another histogram's counts (same bins).
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.underflow += other.underflow;
        self.overflow += other.overflow;
        self.count += other.count;
        self.sum += other.sum;
        self.sum_sq += other.sum_sq;
        self.min = min_opt(self.min, other.min, f64::min);
        self.max = min_opt(self.max, other.max, f64::max);
    }

    /// (bin centre, density) for the non-empty bins: count / (total · bin width).
    pub fn density(&self) -> Vec<(f64, f64)> {
        let width = (self.hi - self.lo) / self.counts.len() as f64;
        let total = self.count.max(1) as f64;
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, c)| **c > 0)
            .map(|(i, c)| {
                (
                    self.lo + (i as f64 + 0.5) * width,
                    *c as f64 / (total * width),
                )
            })
            .collect()
    }

    /// The density as a step line over every bin in `[from, to)`: each bin's (left edge, d),
    /// (right edge, d), empty bins at 0, so the reader sees bins, not a line through them.
    pub fn steps(&self, from: f64, to: f64) -> Vec<(f64, f64)> {
        let width = (self.hi - self.lo) / self.counts.len() as f64;
        let total = self.count.max(1) as f64;
        // Edges are sums of tenths: compare them with a tolerance far below a bin.
        let eps = 1e-6 * width;
        let mut out = Vec::new();
        for (i, c) in self.counts.iter().enumerate() {
            let left = self.lo + i as f64 * width;
            if left + width <= from + eps || left >= to - eps {
                continue;
            }
            let d = *c as f64 / (total * width);
            out.push((left, d));
            out.push((left + width, d));
        }
        out
    }

    /// The share of values with |x| > `alpha` (the tail ACPO clips), at the bins' resolution: a
    /// bin counts when its centre is beyond ±alpha; under- and overflow always count.
    pub fn tail_mass(&self, alpha: f64) -> f64 {
        let width = (self.hi - self.lo) / self.counts.len() as f64;
        let beyond: u64 = self
            .counts
            .iter()
            .enumerate()
            .filter(|(i, _)| (self.lo + (*i as f64 + 0.5) * width).abs() > alpha)
            .map(|(_, c)| c)
            .sum();
        (beyond + self.underflow + self.overflow) as f64 / self.count.max(1) as f64
    }

    /// The smallest bin edge q ≥ 0 with at least a share `p` of the values in [−q, q].
    pub fn abs_quantile(&self, p: f64) -> f64 {
        let width = (self.hi - self.lo) / self.counts.len() as f64;
        let need = (p * self.count as f64).ceil() as u64;
        let mut q = 0.0;
        while q < self.hi {
            let inside: u64 = self
                .counts
                .iter()
                .enumerate()
                .filter(|(i, _)| (self.lo + (*i as f64 + 0.5) * width).abs() < q)
                .map(|(_, c)| c)
                .sum();
            if inside >= need {
                return q;
            }
            q += width;
        }
        self.hi
    }

    pub fn add(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        self.count += 1;
        self.sum += x;
        self.sum_sq += x * x;
        self.min = Some(self.min.map_or(x, |m| m.min(x)));
        self.max = Some(self.max.map_or(x, |m| m.max(x)));
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

fn min_opt(a: Option<f64>, b: Option<f64>, pick: fn(f64, f64) -> f64) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(pick(x, y)),
        (x, None) => x,
        (None, y) => y,
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
