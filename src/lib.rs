//! acpo: a reproduction harness for *Towards Better Training Signal: Advantage Clipped Policy
//! Optimization* (ACPO).
//!
//! PPO and GRPO clip the importance ratio r = π/π_old; ACPO clips the product r·Â to [−α, α]
//! (paper eq. 5). The data flow (DESIGN.md): [`manifest`] → [`train`] (which uses [`model`],
//! [`rollout`], [`verify`], [`algo`], [`optim`], [`eval`] and [`bench`]) → `results/` →
//! [`report`] → [`archive`]. [`algo`] is the one home of the objectives' math and [`verify`]
//! the one judge of answers.

pub mod algo;
pub mod archive;
pub mod atomic;
pub mod bench;
pub mod eval;
pub mod fused;
pub mod manifest;
pub mod model;
pub mod optim;
pub mod parallel;
pub mod pmd;
pub mod report;
pub mod rng;
pub mod rollout;
pub mod speed;
pub mod train;
pub mod verify;
