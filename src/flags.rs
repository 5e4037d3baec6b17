//! The valid ranges of the command line's numeric flags (issue #47, item 10): every numeric
//! flag is parsed by one of these, so a value outside its range — 0 where at least one is
//! needed, a count no machine could hold, a negative, `inf`, `NaN` — is refused by clap before
//! any command runs: exit 2, one message naming the flag and the range. A value is never
//! replaced by another one silently. The bounds are generous: they refuse what cannot be meant,
//! not what is merely large (each says why it is where it is).
//!
//! Checks that need more than the number (a micro-batch must divide its mini-batch, prompts ×
//! samples must fit the device) stay with the command, and name the flag too.

use std::ffi::OsStr;
use std::ops::RangeInclusive;

use clap::builder::TypedValueParser;

/// Training steps: a manifest's, `--max-steps`, an evaluation's step, the pipeline's (the
/// paper's runs take 100 to 300; 2^24 is years of training at a second a step).
pub const MAX_STEPS: usize = 1 << 24;

/// Sequences, prompts or problems in one call or one step: the sequences `acpo generate`
/// samples in one call (prompts × `--n`), batches, micro-batches, problems per benchmark.
pub const MAX_SEQUENCES: usize = 1 << 20;

/// Tokens of one sequence: its prompt, its response, the whole ([`crate::model::MAX_POSITIONS`],
/// the longest context a model config may declare).
pub const MAX_TOKENS: usize = crate::model::MAX_POSITIONS;

/// Timed repetitions of a benchmark (the median is reported; 3 is the default).
pub const MAX_REPEATS: usize = 1 << 10;

/// GPUs per node, and nodes, of an exported launch (the paper used one node of 2-8 H100s).
pub const MAX_GPUS_PER_NODE: usize = 1 << 10;
pub const MAX_NODES: usize = 1 << 16;

/// Random MDPs and iterations of the clipped-PMD check (5 and 100 by default; the bounds keep
/// a run under hours).
pub const MAX_MDPS: u64 = 1 << 10;
pub const MAX_PMD_ITERATIONS: usize = 1 << 20;

/// A count in `1..=max`: a number of things of which there must be at least one.
pub fn count(max: usize) -> Whole<usize> {
    Whole::new(1, max as u64)
}

/// A number in `0..=max` where 0 means something (the starting evaluation's step, logits by
/// positions).
pub fn from_zero(max: usize) -> Whole<usize> {
    Whole::new(0, max as u64)
}

/// [`count`] of a u64 flag.
pub fn count_u64(max: u64) -> Whole<u64> {
    Whole::new(1, max)
}

/// A seed: every u64 is one.
pub fn seed() -> Whole<u64> {
    Whole::new(0, u64::MAX)
}

/// A whole number in `low..=high` (decimal digits, no sign), as a `T`.
#[derive(Debug, Clone, Copy)]
pub struct Whole<T> {
    low: u64,
    high: u64,
    of: std::marker::PhantomData<fn() -> T>,
}

impl<T> Whole<T> {
    fn new(low: u64, high: u64) -> Whole<T> {
        Whole {
            low,
            high,
            of: std::marker::PhantomData,
        }
    }

    /// The range as the error message says it.
    pub fn describe(&self) -> String {
        format!(
            "a whole number at least {} and at most {}",
            self.low, self.high
        )
    }
}

impl<T: TryFrom<u64> + Clone + Send + Sync + 'static> TypedValueParser for Whole<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        let refuse = |why| refusal(cmd, arg, value, why);
        let x = value
            .to_str()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|x| (self.low..=self.high).contains(x))
            .ok_or_else(|| refuse(format!("must be {}", self.describe())))?;
        T::try_from(x).map_err(|_| refuse(format!("must be {}", self.describe())))
    }
}

/// clap's error for a value outside its flag's range: `invalid value 'V' for '--flag <FLAG>':
/// WHY`, exit 2.
fn refusal(
    cmd: &clap::Command,
    arg: Option<&clap::Arg>,
    value: &OsStr,
    why: String,
) -> clap::Error {
    let flag = arg.map_or_else(|| "...".to_owned(), ToString::to_string);
    let value = value.to_string_lossy();
    clap::Error::raw(
        clap::error::ErrorKind::ValueValidation,
        format!("invalid value '{value}' for '{flag}': {why}\n"),
    )
    .with_cmd(cmd)
}

/// A finite real number in `range`, `0` also allowed where `zero` says what it means: a
/// sampling temperature is 0 (greedy) or at least rollout's `MIN_TEMPERATURE`, a
/// nucleus `top_p` in (0, 1].
#[derive(Debug, Clone)]
pub struct Real {
    /// Its bounds; `low_open` excludes the lower one.
    range: RangeInclusive<f64>,
    low_open: bool,
    /// Zero, allowed outside the range, and what it means.
    zero: Option<&'static str>,
}

impl Real {
    /// Any finite value in `range` (both ends included).
    pub fn within(range: RangeInclusive<f64>) -> Real {
        Real {
            range,
            low_open: false,
            zero: None,
        }
    }

    /// Any finite value above `low` up to `high`.
    pub fn above(low: f64, high: f64) -> Real {
        Real {
            range: low..=high,
            low_open: true,
            zero: None,
        }
    }

    /// Also 0, meaning `what`.
    pub fn or_zero(mut self, what: &'static str) -> Real {
        self.zero = Some(what);
        self
    }

    /// Whether `x` is in the range.
    pub fn holds(&self, x: f64) -> bool {
        let (lo, hi) = (*self.range.start(), *self.range.end());
        let above = if self.low_open { x > lo } else { x >= lo };
        x.is_finite() && ((above && x <= hi) || (x == 0.0 && self.zero.is_some()))
    }

    /// The range as the error message says it.
    pub fn describe(&self) -> String {
        let (lo, hi) = (*self.range.start(), *self.range.end());
        let open = if self.low_open { "(" } else { "[" };
        let hi = if hi == f64::MAX {
            "any finite number".to_string()
        } else {
            format!("{hi}]")
        };
        let range = if hi.starts_with("any") {
            format!(
                "at least {lo}{}",
                if self.low_open { " (excluded)" } else { "" }
            )
        } else {
            format!("in {open}{lo}, {hi}")
        };
        match self.zero {
            Some(what) => format!("0 ({what}) or {range}"),
            None => range,
        }
    }
}

impl TypedValueParser for Real {
    type Value = f64;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<f64, clap::Error> {
        let refuse = |why| refusal(cmd, arg, value, why);
        let text = value.to_str().ok_or_else(|| refuse("not UTF-8".into()))?;
        let x: f64 = text
            .trim()
            .parse()
            .map_err(|e| refuse(format!("not a number ({e})")))?;
        if !self.holds(x) {
            return Err(refuse(format!("must be {}", self.describe())));
        }
        Ok(x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_range_refuses_non_finite_values_and_keeps_zero_only_where_it_means_something() {
        // the temperature range rollout builds (0.01: its MIN_TEMPERATURE; flags
        // sits below rollout and the manifest and names neither)
        let t = Real::within(0.01..=f64::MAX).or_zero("greedy");
        for ok in [0.0, 0.01, 1.0, 1e300] {
            assert!(t.holds(ok), "{ok}");
        }
        for bad in [-1.0, 0.001, f64::INFINITY, f64::NAN, -0.5] {
            assert!(!t.holds(bad), "{bad}");
        }
        let p = Real::above(0.0, 1.0);
        assert!(p.holds(1.0) && p.holds(1e-9));
        assert!(!p.holds(0.0) && !p.holds(1.0000001) && !p.holds(f64::NAN));
        assert_eq!(p.describe(), "in (0, 1]");
        assert_eq!(t.describe(), "0 (greedy) or at least 0.01");
    }
}
