//! `session_signatures`: a session started with a `public_key` runs only
//! prompts whose `signature` verifies, by a reference of this checker's own
//! (secp256k1 ECDSA with SHA-256 over `session_id`, `message_index` and
//! `content` joined by newlines, PROTOCOLS.md): a prompt whose signature
//! does not verify never reaches the tokenizer, and one whose signature
//! verifies is never refused for its signature. (A start whose key does not
//! parse is refused: `session_replies` judges starts.)

use k256::ecdsa::signature::Verifier;
use k256::ecdsa::{Signature, VerifyingKey};
use tokenwire_core::{Dialect, Output};

use super::view::{Msg, MsgKind, SessionConnView, Stage};
use crate::invariants::{Check, Checker, Cx, Frame};

/// Bytes of hex text, if it is hex of whole bytes.
fn unhex(s: &str) -> Option<Vec<u8>> {
    let digits: Option<Vec<u8>> = s.chars().map(|c| c.to_digit(16).map(|d| d as u8)).collect();
    let digits = digits?;
    if digits.len() % 2 != 0 {
        return None;
    }
    Some(digits.chunks(2).map(|p| p[0] << 4 | p[1]).collect())
}

/// The key a `public_key` field names, if it is one (SEC1, hex).
pub fn reference_key(hex: &str) -> Option<VerifyingKey> {
    VerifyingKey::from_sec1_bytes(&unhex(hex)?).ok()
}

/// Whether `signature` (hex of `r || s`) signs the prompt for `key`.
pub fn reference_verify(
    key: &str,
    sid: &str,
    index: u64,
    content: &str,
    signature: Option<&str>,
) -> bool {
    let (Some(key), Some(sig)) = (reference_key(key), signature.and_then(unhex)) else {
        return false;
    };
    let Ok(sig) = Signature::from_slice(&sig) else {
        return false;
    };
    let text = format!("{sid}\n{index}\n{content}");
    key.verify(text.as_bytes(), &sig).is_ok()
}

/// A prompt the Host is about to handle in a session with a key: whether
/// its signature verifies.
fn keyed_prompt(s: &SessionConnView, m: &Msg) -> Option<(String, bool)> {
    let MsgKind::Prompt {
        sid,
        index,
        content,
        signature,
        ..
    } = &m.kind
    else {
        return None;
    };
    if m.stage != Stage::Sent {
        return None;
    }
    let key = s.live.get(sid)?.key.as_deref()?;
    Some((
        sid.clone(),
        reference_verify(key, sid, *index, content, signature.as_deref()),
    ))
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct SessionSignatures;

impl Checker for SessionSignatures {
    fn name(&self) -> &'static str {
        "session_signatures"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, frame: Option<&Frame>) -> Check {
        match (out, frame) {
            (Output::Tokenize(job), _) => {
                let Some(s) = cx.view.session(&job.conn) else {
                    return Ok(());
                };
                match s.next_handled().and_then(|m| keyed_prompt(s, m)) {
                    Some((sid, false)) => Err(format!(
                        "a prompt of {sid:?} on {:?} whose signature does not verify went to the tokenizer",
                        job.conn
                    )),
                    _ => Ok(()),
                }
            }
            (Output::Send { conn, .. }, Some(f)) if f.kind() == "error" => {
                let Some(c) = cx.view.conns.get(conn) else {
                    return Ok(());
                };
                let Some(s) = c.session.as_ref().filter(|_| c.dialect == Dialect::Session) else {
                    return Ok(());
                };
                let message = f.str("message").unwrap_or("");
                match s.answered_by(f).and_then(|m| keyed_prompt(s, m)) {
                    Some((sid, true)) if message.contains("`signature`") => Err(format!(
                        "a prompt of {sid:?} on {conn:?} whose signature verifies was refused for it: {message}"
                    )),
                    _ => Ok(()),
                }
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::session::view::Live;
    use crate::invariants::testkit::kit;
    use k256::ecdsa::signature::Signer;
    use k256::ecdsa::SigningKey;
    use serde_json::json;
    use tokenwire_core::testing::ByteCodec;
    use tokenwire_core::{ConnId, TextJob, TextJobId, TextWork};

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn signed(sk: &SigningKey, sid: &str, index: u64, content: &str) -> String {
        let sig: Signature = sk.sign(format!("{sid}\n{index}\n{content}").as_bytes());
        hex(&sig.to_bytes())
    }

    #[test]
    fn the_reference_verifies_only_the_signed_prompt() {
        let sk = SigningKey::from_slice(&[9u8; 32]).expect("key");
        let pk = hex(&sk.verifying_key().to_sec1_bytes());
        let sig = signed(&sk, "s", 2, "hi");
        assert!(reference_verify(&pk, "s", 2, "hi", Some(&sig)));
        assert!(!reference_verify(&pk, "s", 3, "hi", Some(&sig)));
        assert!(!reference_verify(&pk, "s", 2, "ho", Some(&sig)));
        assert!(!reference_verify(&pk, "s", 2, "hi", None));
        assert!(!reference_verify(&pk, "s", 2, "hi", Some("zz")));
        assert!(reference_key("02").is_none());
        assert!(reference_key(&pk).is_some());
    }

    /// A kit with a keyed live session `s` on connection 1 and a prompt
    /// signed with `signature` waiting.
    fn keyed_kit(signature: Option<String>) -> crate::invariants::testkit::Kit {
        let sk = SigningKey::from_slice(&[5u8; 32]).expect("key");
        let mut k = kit(Box::new(SessionSignatures));
        k.open_as(1, Dialect::Session);
        let sig = signature.unwrap_or_else(|| signed(&sk, "s", 0, "hello"));
        let c = k.m.view_mut().conns.get_mut(&ConnId(1)).expect("conn");
        let s = c.session.as_mut().expect("session");
        let key = hex(&sk.verifying_key().to_sec1_bytes());
        s.live
            .insert("s".into(), Live::started(vec![], Some(key), "j".into()));
        s.queue.push_back(Msg {
            kind: MsgKind::Prompt {
                sid: "s".into(),
                index: 0,
                stream: true,
                content: "hello".into(),
                max_tokens: None,
                signature: Some(sig),
            },
            stage: Stage::Sent,
            fitted: None,
            accepted: None,
            raw_type: Some("prompt".into()),
            raw_job: None,
        });
        k
    }

    fn tokenize() -> Output {
        Output::Tokenize(TextJob {
            id: TextJobId(1),
            conn: ConnId(1),
            codec: ByteCodec::shared(),
            work: TextWork::Encode {
                text: "hello".into(),
                add_special: true,
            },
        })
    }

    #[test]
    fn a_badly_signed_prompt_that_reaches_the_tokenizer_is_caught() {
        let mut good = keyed_kit(None);
        good.out(tokenize()).expect("a valid signature runs");
        let mut bad = keyed_kit(Some("00".repeat(64)));
        let e = bad
            .out(tokenize())
            .expect_err("an invalid signature must not run");
        assert_eq!(e.invariant, "session_signatures");
    }

    #[test]
    fn a_valid_signature_refused_for_its_signature_is_caught() {
        let refusal = json!({"type": "error", "session_id": "s", "code": "invalid_request",
            "message": "`signature` does not verify", "recoverable": true, "timestamp": 0});
        let mut bad = keyed_kit(Some("00".repeat(64)));
        bad.send(1, refusal.clone())
            .expect("an invalid signature is refused");
        let mut good = keyed_kit(None);
        let e = good
            .send(1, refusal)
            .expect_err("a valid signature must not be refused");
        assert_eq!(e.invariant, "session_signatures");
    }
}
