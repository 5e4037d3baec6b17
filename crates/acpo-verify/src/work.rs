//! The verifier's work budget: every answer is judged in bounded work, whatever its text.
//!
//! Training rewards call the verifier on whatever the policy writes, so a short answer must not
//! be able to stall a step (`\boxed{2000!·2000!·…}` is 190 bytes of exact products whose
//! reductions are quadratic in their size). Each judgement gets [`BUDGET`] units; the expensive
//! steps charge before they act, and once the budget is gone every further step refuses, so the
//! judgement unwinds at once and [`super::verify`] reports an error verdict instead of "wrong".
//!
//! A unit is about one machine-word operation. The budget counts work, never time, so a verdict
//! does not depend on the machine (DEVELOPERS.md). Costs charged:
//! - a comparison step of two expressions: [`STEP`];
//! - a node visited in exact or numeric evaluation, a `±` expansion: 1;
//! - an exact rational operation on operands of `n` bits in all: `n · (n/64 + 1)`, the cost of
//!   the binary GCD that reduces its result (num-bigint's `gcd` is Stein's algorithm: about one
//!   pass over the `n/64` words per bit), which dominates the product itself.
//!
//! The budget is more than 100× the most any gold answer of the four benchmarks and
//! DAPO-Math-17k needs (a test holds it to that; `acpo bench verifier` reports the factor), and
//! tens of milliseconds of work on a laptop core.

use std::cell::Cell;

/// Units one judgement may spend.
pub const BUDGET: u64 = 100_000_000;

/// Units charged for one comparison step.
pub const STEP: u64 = 64;

thread_local! {
    static LEFT: Cell<u64> = const { Cell::new(BUDGET) };
    static EXHAUSTED: Cell<bool> = const { Cell::new(false) };
}

/// The result of `f` run on a fresh budget, whether the budget ran out during it, and the units
/// it spent.
pub fn metered<T>(f: impl FnOnce() -> T) -> (T, Spent) {
    LEFT.with(|l| l.set(BUDGET));
    EXHAUSTED.with(|e| e.set(false));
    let out = f();
    let spent = Spent {
        units: BUDGET - LEFT.with(Cell::get),
        exhausted: EXHAUSTED.with(Cell::get),
    };
    (out, spent)
}

/// What one metered judgement cost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Spent {
    pub units: u64,
    /// Whether some step was refused: the result may be "not equal" only for want of work.
    pub exhausted: bool,
}

/// Takes `units` from the budget; false (and nothing taken) when they are not there, after
/// which every charge fails until the next [`metered`] call.
pub fn charge(units: u64) -> bool {
    if EXHAUSTED.with(Cell::get) {
        return false;
    }
    LEFT.with(|l| {
        let left = l.get();
        if units > left {
            EXHAUSTED.with(|e| e.set(true));
            false
        } else {
            l.set(left - units);
            true
        }
    })
}

/// The cost of one exact rational operation on operands of `bits` bits in all.
pub fn rational_op(bits: u64) -> u64 {
    bits.saturating_mul(bits / 64 + 1).max(1)
}
