//! The core's random sources, both seeded by the caller (the core never asks
//! the OS), so the same seed and the same inputs give the same outputs.
//!
//! - [`HostRng`] (ChaCha20): the Host's own source of ids and default
//!   sampling seeds. Ids that clients see are keys to what the server keeps
//!   for them, so no id may be predictable from others: a cryptographic
//!   generator, whose 256-bit [`Seed`] the server draws from the OS and the
//!   simulator derives from its run seed.
//! - [`Rng`] (xoshiro256**): fast and small, for whatever needs no secrecy
//!   (the simulator's swarms, tests).

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

/// The 256-bit seed of a [`HostRng`].
#[derive(Clone, PartialEq, Eq)]
pub struct Seed(pub [u8; 32]);

impl std::fmt::Debug for Seed {
    // A seed is a secret: it predicts every id.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seed(..)")
    }
}

impl From<u64> for Seed {
    /// A seed expanded from 64 bits (reproducible runs: tests, the
    /// simulator, `--seed`). Only as unpredictable as those 64 bits.
    fn from(seed: u64) -> Seed {
        let mut sm = seed;
        let mut out = [0u8; 32];
        for chunk in out.chunks_mut(8) {
            chunk.copy_from_slice(&splitmix64(&mut sm).to_le_bytes());
        }
        Seed(out)
    }
}

impl From<[u8; 32]> for Seed {
    fn from(bytes: [u8; 32]) -> Seed {
        Seed(bytes)
    }
}

/// The Host's random source: ChaCha20 keyed by a [`Seed`].
#[derive(Clone)]
pub struct HostRng(ChaCha20Rng);

impl std::fmt::Debug for HostRng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("HostRng(..)")
    }
}

impl HostRng {
    /// A generator whose whole stream is fixed by `seed`.
    pub fn new(seed: impl Into<Seed>) -> HostRng {
        HostRng(ChaCha20Rng::from_seed(seed.into().0))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        self.0.fill_bytes(buf);
    }
}

/// Seeded pseudo-random generator. Not cryptographic: it makes ids unique and
/// runs reproducible, nothing more.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

/// One step of splitmix64: used to expand a seed and to hash small values.
pub fn splitmix64(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Mixes two values into one well-distributed 64-bit value (seed derivation).
pub fn mix64(a: u64, b: u64) -> u64 {
    let mut s = a ^ b.rotate_left(32) ^ 0xD6E8_FEB8_6659_FD93;
    splitmix64(&mut s);
    splitmix64(&mut s)
}

impl Rng {
    /// A generator whose whole sequence is fixed by `seed`.
    pub fn new(seed: u64) -> Self {
        let mut sm = seed;
        let s = [
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
            splitmix64(&mut sm),
        ];
        Rng { s }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// A uniform float in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform integer in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_and_different_seeds_differ() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let mut c = Rng::new(8);
        let va: Vec<u64> = (0..16).map(|_| a.next_u64()).collect();
        let vb: Vec<u64> = (0..16).map(|_| b.next_u64()).collect();
        let vc: Vec<u64> = (0..16).map(|_| c.next_u64()).collect();
        assert_eq!(va, vb);
        assert_ne!(va, vc);
    }

    #[test]
    fn the_host_source_is_chacha20_and_fixed_by_its_seed() {
        // RFC 8439 (A.1, test vector 1): the all-zero key's keystream
        // starts 76 b8 e0 ad a0 f1 3d 90, read here as a little-endian u64.
        let mut r = HostRng::new(Seed([0; 32]));
        assert_eq!(r.next_u64(), 0x903d_f1a0_ade0_b876);
        let mut a = HostRng::new(5u64);
        let mut b = HostRng::new(5u64);
        let mut c = HostRng::new(6u64);
        let (x, y, z) = (a.next_u64(), b.next_u64(), c.next_u64());
        assert_eq!(x, y);
        assert_ne!(x, z);
        assert_eq!(format!("{:?}", Seed::from(5u64)), "Seed(..)");
    }

    #[test]
    fn below_stays_in_range_and_floats_in_unit_interval() {
        let mut r = Rng::new(1);
        for n in 1..200u64 {
            assert!(r.below(n) < n);
            let f = r.next_f64();
            assert!((0.0..1.0).contains(&f));
        }
    }
}
