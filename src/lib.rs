//! acpo: a reproduction harness for *Towards Better Training Signal: Advantage Clipped Policy
//! Optimization* (ACPO).
//!
//! PPO and GRPO clip the importance ratio r = π/π_old; ACPO clips the product r·Â to [−α, α]
//! (paper eq. 5). The data flow (docs/ARCHITECTURE.md), one direction:
//!
//! [`manifest`] → [`data`] (datasets) and [`model`] (weights from [`hub`]) → [`train`]
//! ([`rollout`] → [`reward`] ([`verify`]) → [`algo`] → [`optim`]; [`eval`] at eval steps) →
//! a [`run`] directory → [`report`] (tables, figures, generated blocks) → [`archive`].
//! [`reproduce`] plans and runs that for a whole scale; [`perf`] measures speed; [`pmd`] checks
//! the theory. [`algo`] is the one home of the objectives' math, [`reward`] the one path from
//! tokens to a score, [`verify`] the one judge of answers, [`run::RunDir`] the one place a run
//! directory's files are named.

// The paper's vocabulary and method.
pub mod algo;
pub mod data;
pub mod reward;
/// The one judge of answers: the crate `acpo-verify` (crates/acpo-verify), its own crate so the
/// Python package and anyone else judge with it without the harness's dependencies.
pub use acpo_verify as verify;

// A run: its manifest, model, sampling, training and evaluation.
pub mod eval;
pub mod generate;
pub mod hub;
pub mod manifest;
pub mod model;
pub mod optim;
pub mod rollout;
pub mod run;
pub mod train;

// The GPU: where tensors live, and our kernels.
pub mod device;
pub mod fused;

// Many runs, and what is made of them.
pub mod archive;
pub mod perf;
pub mod pmd;
pub mod report;
pub mod reproduce;
pub mod sweep;
pub mod verl;

// Helpers every layer uses: files written atomically and read only when regular, a field's
// refusal, the numeric flags' ranges, JSON lines, SHA-256, seeded random streams, worker threads, progress bars.
pub mod atomic;
pub mod checksum;
pub mod field;
pub mod files;
pub mod flags;
pub mod jsonl;
pub mod parallel;
pub mod progress;
pub mod rng;
