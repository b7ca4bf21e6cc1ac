//! Arbitrary bytes into the `generate` dialect's decoders. The client decoder
//! must return a message or an error with a message (never panic), and a
//! decoded message must re-encode to a frame that decodes to the same message.
//! The server decoder (what clients run) must not panic either, and what it
//! accepts must survive an encode/decode round trip.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tokenwire_core::dialect::generate::codec;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    match codec::decode_client(&text) {
        Ok(msg) => {
            let again = codec::decode_client(&codec::encode_client(&msg));
            assert_eq!(again.as_ref(), Ok(&msg), "client round trip of {text:?}");
        }
        Err(e) => assert!(!e.message.is_empty(), "an error says what was wrong"),
    }
    if let Ok(msg) = codec::decode_server(&text) {
        let again = codec::decode_server(&codec::encode_server(&msg));
        // NaN never decodes (JSON has no NaN), so equality is meaningful.
        assert_eq!(again.as_ref(), Ok(&msg), "server round trip of {text:?}");
    }
});
