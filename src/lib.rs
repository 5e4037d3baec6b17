//! acpo: a reproduction harness for *Towards Better Training Signal: Advantage Clipped Policy
//! Optimization* (ACPO).
//!
//! PPO and GRPO clip the importance ratio r = π/π_old; ACPO clips the product r·Â to [−α, α]
//! (paper eq. 5). The data flow (DESIGN.md), one direction:
//!
//! [`manifest`] → [`data`] (datasets) and [`model`] (weights from [`hub`]) → [`train`]
//! ([`rollout`] → [`reward`] ([`verify`]) → [`algo`] → [`optim`]; [`eval`] at eval steps) →
//! a [`run`] directory → [`report`] (tables, figures via [`plot`]) → [`archive`].
//! [`reproduce`] plans and runs that for a whole scale; [`perf`] measures speed; [`pmd`] checks
//! the theory. [`algo`] is the one home of the objectives' math, [`reward`] the one path from
//! tokens to a score, [`verify`] the one judge of answers, [`run::RunDir`] the one place a run
//! directory's files are named.

pub mod algo;
pub mod archive;
pub mod atomic;
pub mod checksum;
pub mod data;
pub mod device;
pub mod eval;
pub mod fused;
pub mod generate;
pub mod hub;
pub mod jsonl;
pub mod manifest;
pub mod model;
pub mod optim;
pub mod parallel;
pub mod perf;
pub mod plot;
pub mod pmd;
pub mod progress;
pub mod report;
pub mod reproduce;
pub mod reward;
pub mod rng;
pub mod rollout;
pub mod run;
pub mod sweep;
pub mod train;
pub mod verify;
pub mod verl;
