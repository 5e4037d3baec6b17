//! The project's own random number generator, so results never change with a crate upgrade.
//!
//! SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number generators", 2014):
//! state += 0x9E3779B97F4A7C15, output = the standard 64-bit finaliser of the state. Streams are
//! derived from tuples such as (seed, step, prompt, sample) by folding each component through the
//! finaliser, so a sample's random numbers depend only on its own coordinates, never on batch
//! composition or on how many other samples were drawn.

const GOLDEN: u64 = 0x9E37_79B9_7F4A_7C15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// A stream keyed by a tuple of coordinates, e.g. `&[seed, step, prompt, sample]`.
    pub fn from_key(key: &[u64]) -> SplitMix64 {
        let state = key.iter().fold(0x005E_ED0F_AC90_u64, |acc, k| {
            mix(acc.wrapping_add(GOLDEN) ^ mix(k.wrapping_add(GOLDEN)))
        });
        SplitMix64 { state }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN);
        mix(self.state)
    }

    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Standard normal (Box–Muller, one draw per call).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = 1.0 - self.next_f64(); // (0, 1]
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// The stream `draws` draws of [`SplitMix64::next_u64`] ahead (the state is a counter, so
    /// any position is one step away): lets a long run of draws be split across threads
    /// with the very numbers one thread would draw.
    pub fn ahead(&self, draws: u64) -> SplitMix64 {
        SplitMix64 {
            state: self.state.wrapping_add(draws.wrapping_mul(GOLDEN)),
        }
    }

    /// The raw state, for checkpoints.
    pub fn state(&self) -> u64 {
        self.state
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_published_splitmix64_sequence() {
        // Reference values of SplitMix64 seeded with 1234567 (from the C reference
        // implementation by Vigna, prng.di.unimi.it/splitmix64.c).
        let mut r = SplitMix64::new(1234567);
        let got: Vec<u64> = (0..3).map(|_| r.next_u64()).collect();
        assert_eq!(
            got,
            vec![
                6457827717110365317,
                3203168211198807973,
                9817491932198370423
            ]
        );
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }

    /// The verifier's evaluation points (crates/acpo-verify, which has no dependency on this
    /// crate) are the first draws of the streams keyed by (point, symbol, 0xA115): the numbers
    /// every verdict on an expression with symbols was made with.
    #[test]
    fn the_verifiers_evaluation_points_are_these_streams() {
        for k in 0..8usize {
            for i in 0..8usize {
                let want =
                    0.35 + 2.1 * SplitMix64::from_key(&[k as u64, i as u64, 0xA115]).next_f64();
                assert_eq!(
                    acpo_verify::point(k, i).to_bits(),
                    want.to_bits(),
                    "point {k}, symbol {i}"
                );
            }
        }
    }

    #[test]
    fn a_stream_ahead_draws_what_the_stream_draws_later() {
        let mut r = SplitMix64::from_key(&[3, 1, 4]);
        let ahead = r.ahead(1000);
        for _ in 0..1000 {
            r.next_u64();
        }
        assert_eq!(r, ahead);
    }
}
