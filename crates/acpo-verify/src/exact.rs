//! Exact rational arithmetic under the work budget ([`super::work`]).
//!
//! `num-rational` reduces every result with num-bigint's binary GCD, which costs about one pass
//! over the operand's words per bit even when one side is 1 or 100: `2024^{4046} + 1` took tens
//! of millions of word operations to "reduce" an integer. Here integers never reach a GCD, a
//! power raises numerator and denominator apart (they stay coprime), and a GCD of a big and a
//! small number starts with one division. Every operation charges its cost in words before it
//! runs and returns None when the budget refuses it or the result would exceed `max_bits`.
//!
//! Results are always reduced with a positive denominator, the form `BigRational` compares and
//! prints.

use num_bigint::{BigInt, Sign};
use num_integer::Integer;
use num_rational::BigRational;
use num_traits::{One, Signed, Zero};

use super::work;

/// Words of `x` (at least 1).
fn words(x: &BigInt) -> u64 {
    x.bits() / 64 + 1
}

/// Bits of a value, numerator and denominator.
pub fn bits(r: &BigRational) -> u64 {
    r.numer().bits() + r.denom().bits()
}

/// Charges a schoolbook product of `a` by `b` words (an upper bound of num-bigint's).
fn charge_mul(a: u64, b: u64) -> Option<()> {
    work::charge(a.saturating_mul(b)).then_some(())
}

/// `n / d` reduced, `d ≠ 0`.
fn reduced(n: BigInt, d: BigInt) -> Option<BigRational> {
    if d.is_one() {
        return Some(BigRational::from_integer(n));
    }
    let g = gcd(&n, &d)?;
    let (mut n, mut d) = if g.is_one() {
        (n, d)
    } else {
        charge_mul(words(&n) + words(&d), words(&g))?;
        (n / &g, d / &g)
    };
    if d.sign() == Sign::Minus {
        (n, d) = (-n, -d);
    }
    Some(BigRational::new_raw(n, d))
}

/// gcd(a, b): one division brings the larger down to the smaller's size, then the binary GCD,
/// which costs about (bits · words) of the smaller.
fn gcd(a: &BigInt, b: &BigInt) -> Option<BigInt> {
    let (big, small) = if a.bits() >= b.bits() { (a, b) } else { (b, a) };
    if small.is_zero() {
        return Some(big.abs());
    }
    charge_mul(words(big), words(small))?;
    let rest = big % small;
    work::charge(small.bits().saturating_mul(words(small))).then_some(())?;
    Some(small.gcd(&rest))
}

pub fn add(a: &BigRational, b: &BigRational) -> Option<BigRational> {
    if a.is_integer() && b.is_integer() {
        work::charge(words(a.numer()).max(words(b.numer()))).then_some(())?;
        return Some(BigRational::from_integer(a.numer() + b.numer()));
    }
    charge_mul(words(a.numer()), words(b.denom()))?;
    charge_mul(words(b.numer()), words(a.denom()))?;
    charge_mul(words(a.denom()), words(b.denom()))?;
    reduced(
        a.numer() * b.denom() + b.numer() * a.denom(),
        a.denom() * b.denom(),
    )
}

pub fn mul(a: &BigRational, b: &BigRational) -> Option<BigRational> {
    charge_mul(words(a.numer()), words(b.numer()))?;
    if a.is_integer() && b.is_integer() {
        return Some(BigRational::from_integer(a.numer() * b.numer()));
    }
    charge_mul(words(a.denom()), words(b.denom()))?;
    reduced(a.numer() * b.numer(), a.denom() * b.denom())
}

/// `a / b`; None for `b = 0`.
pub fn div(a: &BigRational, b: &BigRational) -> Option<BigRational> {
    if b.is_zero() {
        return None;
    }
    mul(
        a,
        &BigRational::new_raw(b.denom().clone(), b.numer().clone()),
    )
}

/// `base^exp` for an integer exponent; None for 0 to a negative power. Numerator and denominator
/// are raised apart: coprime numbers have coprime powers, so nothing needs reducing.
pub fn pow(base: &BigRational, exp: i64) -> Option<BigRational> {
    if exp < 0 && base.is_zero() {
        return None;
    }
    let k = u32::try_from(exp.unsigned_abs()).ok()?;
    // repeated squaring: the last square, of half the result's words, costs a quarter of the
    // result's words squared, and all the squares before it a third of that again
    let result_words = |x: &BigInt| x.bits().saturating_mul(k as u64) / 64 + 1;
    let (wn, wd) = (result_words(base.numer()), result_words(base.denom()));
    charge_mul(wn, wn / 3 + 1)?;
    charge_mul(wd, wd / 3 + 1)?;
    let (n, d) = (base.numer().pow(k), base.denom().pow(k));
    let r = BigRational::new_raw(n, d);
    Some(if exp < 0 { recip(r) } else { r })
}

fn recip(r: BigRational) -> BigRational {
    let (n, d) = r.into_raw();
    if n.sign() == Sign::Minus {
        BigRational::new_raw(-d, -n)
    } else {
        BigRational::new_raw(d, n)
    }
}

/// `n!` for `n ≤ 2000`.
pub fn factorial(n: u64) -> Option<BigRational> {
    if n > 2_000 {
        return None;
    }
    // n products of a word by an accumulator of at most n·log2(n) bits
    let bits = n * (64 - n.leading_zeros() as u64);
    work::charge(n * (bits / 64 + 1)).then_some(())?;
    Some(BigRational::from_integer(
        (1..=n).fold(BigInt::one(), |acc, k| acc * BigInt::from(k)),
    ))
}

/// `v` rounded half away from zero to `places` decimal places.
pub fn round_to(v: &BigRational, places: u32) -> Option<BigRational> {
    let scale = BigInt::from(10u32).pow(places);
    let scaled = mul(v, &BigRational::from_integer(scale.clone()))?;
    let (n, d) = (scaled.numer(), scaled.denom());
    charge_mul(words(n), words(d))?;
    let two_d: BigInt = d * 2;
    // floor(x + 1/2) = ⌊(2n + d) / 2d⌋, and its mirror for x < 0
    let twice: BigInt = n * 2;
    let rounded = if n.is_negative() {
        -(d - twice).div_floor(&two_d)
    } else {
        (twice + d).div_floor(&two_d)
    };
    reduced(rounded, scale)
}

/// Whether two reduced values are equal: their parts are (O(words), no cross products).
pub fn same(a: &BigRational, b: &BigRational) -> bool {
    a.numer() == b.numer() && a.denom() == b.denom()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(n: i64, d: i64) -> BigRational {
        BigRational::new(n.into(), d.into())
    }

    /// The budgeted operations agree with num-rational's on signs, zeros and reductions.
    #[test]
    fn agrees_with_num_rational() {
        let values = [
            r(0, 1),
            r(1, 1),
            r(-1, 1),
            r(3, 4),
            r(-3, 4),
            r(6, 1),
            r(-7, 3),
            r(100, 7),
            r(1, 100),
        ];
        work::metered(|| {
            for a in &values {
                for b in &values {
                    assert_eq!(add(a, b).unwrap(), a + b, "{a} + {b}");
                    assert!(same(&add(a, b).unwrap(), &(a + b)), "{a} + {b} reduced");
                    assert!(same(&mul(a, b).unwrap(), &(a * b)), "{a} * {b}");
                    if !b.is_zero() {
                        assert!(same(&div(a, b).unwrap(), &(a / b)), "{a} / {b}");
                    }
                }
                for e in -3i64..=3 {
                    if a.is_zero() && e < 0 {
                        assert!(pow(a, e).is_none());
                        continue;
                    }
                    let want = num_traits::pow::pow(a.clone(), e.unsigned_abs() as usize);
                    let want = if e < 0 { want.recip() } else { want };
                    assert!(same(&pow(a, e).unwrap(), &want), "{a}^{e}");
                }
            }
            assert_eq!(round_to(&r(1, 3), 2).unwrap(), r(33, 100));
            assert_eq!(round_to(&r(-5, 8), 2).unwrap(), r(-63, 100));
            assert_eq!(factorial(5).unwrap(), r(120, 1));
        });
    }
}
