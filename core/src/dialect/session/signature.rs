//! Signed prompts (the `session` source's optional ECDSA signatures for
//! high-value sessions): a session started with a `public_key` (secp256k1,
//! SEC1 hex, compressed or not) accepts only prompts whose `signature` (hex
//! of the 64-byte `r || s`) is a valid ECDSA signature, with SHA-256, over
//! `session_id`, `message_index` and `content` joined by newlines. The index
//! inside the signed text is what stops a prompt replayed at another place
//! of the conversation.

use k256::ecdsa::signature::Verifier;
use k256::ecdsa::{Signature, VerifyingKey};

/// A session's verifying key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptKey(VerifyingKey);

impl PromptKey {
    /// Parses a `public_key` field; the error says what is wrong with it.
    pub fn parse(hex: &str) -> Result<PromptKey, String> {
        let bytes = from_hex(hex).ok_or("`public_key` must be hex")?;
        VerifyingKey::from_sec1_bytes(&bytes)
            .map(PromptKey)
            .map_err(|_| "`public_key` is not a secp256k1 public key (SEC1, 33 or 65 bytes)".into())
    }

    /// Checks `signature` (hex) over the prompt; the error names what is
    /// wrong, never the content.
    pub fn verify(
        &self,
        session_id: &str,
        message_index: u64,
        content: &str,
        signature: Option<&str>,
    ) -> Result<(), String> {
        let sig = signature.ok_or("this session signs its prompts: `signature` is required")?;
        let bytes = from_hex(sig)
            .filter(|b| b.len() == 64)
            .ok_or("`signature` must be the hex of 64 bytes (r || s)")?;
        let sig = Signature::from_slice(&bytes)
            .map_err(|_| "`signature` is not a valid ECDSA signature")?;
        let signed = signed_text(session_id, message_index, content);
        self.0
            .verify(signed.as_bytes(), &sig)
            .map_err(|_| "`signature` does not verify for this session's key, session_id, message_index and content".to_string())
    }
}

/// The text a prompt's signature covers.
pub fn signed_text(session_id: &str, message_index: u64, content: &str) -> String {
    format!("{session_id}\n{message_index}\n{content}")
}

/// The bytes of hex `s`: pairs of hex digits and nothing else (no sign,
/// which `from_str_radix` would take, and no odd digit at the end).
fn from_hex(s: &str) -> Option<Vec<u8>> {
    let digit = |b: &u8| char::from(*b).to_digit(16);
    s.as_bytes()
        .chunks(2)
        .map(|pair| match pair {
            [high, low] => Some((digit(high)? * 16 + digit(low)?) as u8),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k256::ecdsa::signature::Signer;
    use k256::ecdsa::SigningKey;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    #[test]
    fn a_signature_verifies_only_for_its_session_index_and_content() {
        let sk = SigningKey::from_slice(&[7u8; 32]).expect("key");
        let pk = PromptKey::parse(&hex(&sk.verifying_key().to_sec1_bytes())).expect("pk");
        let sig: Signature = sk.sign(signed_text("s1", 2, "hello").as_bytes());
        let sig = hex(&sig.to_bytes());
        assert_eq!(pk.verify("s1", 2, "hello", Some(&sig)), Ok(()));
        assert!(
            pk.verify("s1", 4, "hello", Some(&sig)).is_err(),
            "replayed at another index"
        );
        assert!(
            pk.verify("s1", 2, "hellO", Some(&sig)).is_err(),
            "other content"
        );
        assert!(
            pk.verify("s2", 2, "hello", Some(&sig)).is_err(),
            "other session"
        );
        assert!(pk
            .verify("s1", 2, "hello", None)
            .unwrap_err()
            .contains("required"));
        assert!(pk.verify("s1", 2, "hello", Some("zz")).is_err());
        // Hex is pairs of digits: no sign, no odd digit at the end.
        for bad in [
            format!("+{}", &sig[1..]),
            format!("{sig}0"),
            sig[1..].to_string(),
        ] {
            assert!(
                pk.verify("s1", 2, "hello", Some(&bad))
                    .unwrap_err()
                    .contains("must be the hex"),
                "{bad}"
            );
        }
        assert_eq!(from_hex("0aFf"), Some(vec![0x0a, 0xff]));
        assert!(PromptKey::parse("02abcd").is_err());
        assert!(PromptKey::parse("nothex").is_err());
    }
}
