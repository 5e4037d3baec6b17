//! Exact tabular MDP machinery for the theory check (issue #9): random cost-minimising MDPs,
//! policy evaluation by a linear solve, Q/V/A, the optimal policy (hard or entropy-regularised
//! value iteration) and the stationary distribution of a policy. Notation of the paper's
//! appendix "Proof of Theorems 1 and 2": cost c(s,a) ∈ \[0, 1\], V^π = (I − γP^π)⁻¹(c^π + h^π).

use crate::rng::SplitMix64;

/// A finite discounted MDP; costs are minimised.
#[derive(Debug, Clone)]
pub struct Mdp {
    pub states: usize,
    pub actions: usize,
    pub gamma: f64,
    /// P(s'|s,a) at `(s * actions + a) * states + s'`.
    pub p: Vec<f64>,
    /// c(s,a) at `s * actions + a`.
    pub c: Vec<f64>,
}

/// A stochastic policy as log-probabilities, `s * actions + a` (log space keeps the tiny
/// probabilities of near-deterministic iterates exact enough for KL(π*‖π_k)).
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub actions: usize,
    pub log_p: Vec<f64>,
}

impl Policy {
    pub fn uniform(states: usize, actions: usize) -> Policy {
        Policy {
            actions,
            log_p: vec![-(actions as f64).ln(); states * actions],
        }
    }

    pub fn prob(&self, s: usize, a: usize) -> f64 {
        self.log_p[s * self.actions + a].exp()
    }

    /// KL(other(·|s) ‖ self(·|s)).
    pub fn kl_from(&self, other: &Policy, s: usize) -> f64 {
        (0..self.actions)
            .map(|a| {
                let i = s * self.actions + a;
                let q = other.log_p[i].exp();
                if q > 0.0 {
                    q * (other.log_p[i] - self.log_p[i])
                } else {
                    0.0
                }
            })
            .sum()
    }
}

/// The exact values of a policy.
#[derive(Debug, Clone)]
pub struct Values {
    pub v: Vec<f64>,
    /// Q(s,a) at `s * actions + a`.
    pub q: Vec<f64>,
    /// A(s,a) = Q(s,a) − V(s).
    pub a: Vec<f64>,
}

/// Solves `m x = b` (m row-major n×n) by Gaussian elimination with partial pivoting.
pub fn solve(mut m: Vec<f64>, mut b: Vec<f64>) -> Vec<f64> {
    let n = b.len();
    for col in 0..n {
        let pivot = (col..n)
            .max_by(|&i, &j| m[i * n + col].abs().total_cmp(&m[j * n + col].abs()))
            .unwrap_or(col);
        if pivot != col {
            for k in 0..n {
                m.swap(col * n + k, pivot * n + k);
            }
            b.swap(col, pivot);
        }
        let d = m[col * n + col];
        for row in col + 1..n {
            let f = m[row * n + col] / d;
            if f != 0.0 {
                for k in col..n {
                    m[row * n + k] -= f * m[col * n + k];
                }
                b[row] -= f * b[col];
            }
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let s: f64 = (row + 1..n).map(|k| m[row * n + k] * x[k]).sum();
        x[row] = (b[row] - s) / m[row * n + row];
    }
    x
}

impl Mdp {
    /// A seeded random MDP: each (s,a) moves to `branching` random states with random weights
    /// (sparse transitions make the problem less trivial than dense uniform ones), costs
    /// uniform in \[0, 1\].
    pub fn random(seed: u64, states: usize, actions: usize, gamma: f64, branching: usize) -> Mdp {
        let mut rng = SplitMix64::from_key(&[seed, 0x4D_4450]);
        let mut p = vec![0.0; states * actions * states];
        for sa in 0..states * actions {
            let row = &mut p[sa * states..(sa + 1) * states];
            for _ in 0..branching.max(1) {
                let to = (rng.next_u64() % states as u64) as usize;
                row[to] += rng.next_f64() + 1e-3;
            }
            let total: f64 = row.iter().sum();
            row.iter_mut().for_each(|x| *x /= total);
        }
        let c = (0..states * actions).map(|_| rng.next_f64()).collect();
        Mdp {
            states,
            actions,
            gamma,
            p,
            c,
        }
    }

    fn p(&self, s: usize, a: usize, t: usize) -> f64 {
        self.p[(s * self.actions + a) * self.states + t]
    }

    /// P^π(s, s') row-major.
    pub fn transition(&self, pi: &Policy) -> Vec<f64> {
        let n = self.states;
        let mut m = vec![0.0; n * n];
        for s in 0..n {
            for a in 0..self.actions {
                let w = pi.prob(s, a);
                for t in 0..n {
                    m[s * n + t] += w * self.p(s, a, t);
                }
            }
        }
        m
    }

    /// Exact V, Q, A of `pi` under the per-state regulariser `h` (h^π(s) enters every
    /// stage's cost, paper eq. (value)/(q)).
    pub fn evaluate(&self, pi: &Policy, h: &[f64]) -> Values {
        let (n, na) = (self.states, self.actions);
        let pm = self.transition(pi);
        let mut m = vec![0.0; n * n];
        for s in 0..n {
            for t in 0..n {
                m[s * n + t] = f64::from(u8::from(s == t)) - self.gamma * pm[s * n + t];
            }
        }
        let b: Vec<f64> = (0..n)
            .map(|s| {
                (0..na)
                    .map(|a| pi.prob(s, a) * self.c[s * na + a])
                    .sum::<f64>()
                    + h[s]
            })
            .collect();
        let v = solve(m, b);
        let mut q = vec![0.0; n * na];
        let mut adv = vec![0.0; n * na];
        for s in 0..n {
            for a in 0..na {
                let next: f64 = (0..n).map(|t| self.p(s, a, t) * v[t]).sum();
                q[s * na + a] = self.c[s * na + a] + h[s] + self.gamma * next;
                adv[s * na + a] = q[s * na + a] - v[s];
            }
        }
        Values { v, q, a: adv }
    }

    /// The optimal policy and its values. With μ = 0, value iteration and the greedy
    /// (deterministic) policy; with μ > 0 and h^p = μ·KL(p‖uniform), soft value iteration:
    /// V(s) = −μ log Σ_a (1/|A|) exp(−Q̃(s,a)/μ), π*(a|s) ∝ exp(−Q̃(s,a)/μ), Q̃ = c + γPV.
    /// Iterates until the sup-norm change is below 1e-14 (a γ-contraction).
    pub fn optimal(&self, mu: f64) -> Policy {
        let (n, na) = (self.states, self.actions);
        let mut v = vec![0.0; n];
        let q_tilde = |v: &[f64]| -> Vec<f64> {
            let mut q = vec![0.0; n * na];
            for s in 0..n {
                for a in 0..na {
                    let next: f64 = (0..n).map(|t| self.p(s, a, t) * v[t]).sum();
                    q[s * na + a] = self.c[s * na + a] + self.gamma * next;
                }
            }
            q
        };
        for _ in 0..100_000 {
            let q = q_tilde(&v);
            let mut delta = 0f64;
            for s in 0..n {
                let row = &q[s * na..(s + 1) * na];
                let new = if mu > 0.0 {
                    let m = row.iter().copied().fold(f64::INFINITY, f64::min);
                    let z: f64 = row.iter().map(|x| (-(x - m) / mu).exp()).sum::<f64>() / na as f64;
                    m - mu * z.ln()
                } else {
                    row.iter().copied().fold(f64::INFINITY, f64::min)
                };
                delta = delta.max((new - v[s]).abs());
                v[s] = new;
            }
            if delta < 1e-14 {
                break;
            }
        }
        let q = q_tilde(&v);
        let mut log_p = vec![f64::NEG_INFINITY; n * na];
        for s in 0..n {
            let row = &q[s * na..(s + 1) * na];
            if mu > 0.0 {
                let m = row.iter().copied().fold(f64::INFINITY, f64::min);
                let z: f64 = row.iter().map(|x| (-(x - m) / mu).exp()).sum();
                for a in 0..na {
                    log_p[s * na + a] = -(row[a] - m) / mu - z.ln();
                }
            } else {
                let best = (0..na)
                    .min_by(|&i, &j| row[i].total_cmp(&row[j]))
                    .unwrap_or(0);
                log_p[s * na + best] = 0.0;
            }
        }
        Policy { actions: na, log_p }
    }

    /// The stationary distribution ν of P^π: ν^T P^π = ν^T, Σν = 1 (one equation of the
    /// singular system replaced by the normalisation).
    pub fn stationary(&self, pi: &Policy) -> Vec<f64> {
        let n = self.states;
        let pm = self.transition(pi);
        let mut m = vec![0.0; n * n];
        for i in 0..n {
            for j in 0..n {
                // Row i of (P^T − I).
                m[i * n + j] = pm[j * n + i] - f64::from(u8::from(i == j));
            }
        }
        for j in 0..n {
            m[(n - 1) * n + j] = 1.0;
        }
        let mut b = vec![0.0; n];
        b[n - 1] = 1.0;
        solve(m, b)
    }
}
