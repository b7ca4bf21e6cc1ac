//! UUID v7 ids (RFC 9562) made from the injected clock and the Host's PRNG.

use crate::rng::HostRng;

/// A time-ordered UUID v7 for `unix_ms`, its random bits drawn from `rng`.
pub fn uuid7(unix_ms: u64, rng: &mut HostRng) -> uuid::Uuid {
    let mut random = [0u8; 10];
    rng.fill(&mut random);
    uuid::Builder::from_unix_timestamp_millis(unix_ms, &random).into_uuid()
}

/// `prefix` followed by a hyphenated UUID v7, e.g. `gen_0190...`.
pub fn prefixed(prefix: &str, unix_ms: u64, rng: &mut HostRng) -> String {
    let mut s = String::with_capacity(prefix.len() + 36);
    s.push_str(prefix);
    s.push_str(&uuid7(unix_ms, rng).hyphenated().to_string());
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_version_7_and_time_ordered() {
        let mut rng = HostRng::new(3u64);
        let a = uuid7(1_700_000_000_000, &mut rng);
        let b = uuid7(1_700_000_000_001, &mut rng);
        assert_eq!(a.get_version_num(), 7);
        assert!(a.to_string() < b.to_string());
        assert!(prefixed("gen_", 5, &mut rng).starts_with("gen_"));
    }
}
