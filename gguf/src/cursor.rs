//! A bounds-checked little-endian reader over a GGUF file's bytes: every read
//! says what it was reading when the file ends early, and no length taken
//! from the file is trusted before it is checked against what is left.

use super::GgufError;

/// Reads values in order from a byte slice.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, pos: 0 }
    }

    /// Offset of the next read.
    pub fn pos(&self) -> usize {
        self.pos
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.pos
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::at(
                self.pos,
                format!(
                    "the file ends inside {what} ({n} bytes needed, {} left; truncated?)",
                    self.remaining()
                ),
            ));
        }
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let b = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    pub fn u8(&mut self, what: &str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }

    pub fn u16(&mut self, what: &str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    pub fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    pub fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A count that must fit in what is left, each item taking at least
    /// `min_item` bytes (so a forged count cannot make us allocate).
    pub fn count(&mut self, min_item: usize, what: &str) -> Result<usize, GgufError> {
        let at = self.pos;
        let n = self.u64(what)?;
        let fits = usize::try_from(n)
            .ok()
            .filter(|&n| n.saturating_mul(min_item.max(1)) <= self.remaining());
        fits.ok_or_else(|| {
            GgufError::at(
                at,
                format!(
                    "{what} is {n}, more than the {} bytes left can hold (truncated or corrupt file?)",
                    self.remaining()
                ),
            )
        })
    }

    /// A GGUF string: a u64 length, then that many UTF-8 bytes.
    pub fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let at = self.pos;
        let len = self.count(1, what)?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| GgufError::at(at, format!("{what} is not valid UTF-8")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_reads_and_forged_lengths_are_errors_not_panics() {
        let mut c = Cursor::new(&[1, 0, 0]);
        assert!(c.u32("a version").is_err());
        let forged = u64::MAX.to_le_bytes();
        let mut c = Cursor::new(&forged);
        let e = c.string("a key").expect_err("forged length");
        assert!(e.to_string().contains("a key"), "{e}");
        let mut bytes = 3u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[0xff, 0xfe, 0x00]);
        let e = Cursor::new(&bytes).string("a key").expect_err("not UTF-8");
        assert!(e.to_string().contains("UTF-8"), "{e}");
        let mut bytes = 2u64.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"hi");
        assert_eq!(Cursor::new(&bytes).string("s").expect("ok"), "hi");
    }
}
