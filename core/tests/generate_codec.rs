//! Property tests of the `generate` dialect's codec: every message type
//! round-trips, and arbitrary bytes or JSON never panic the decoder or the
//! connection, and always get the dialect's `invalid_request` error.

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use tokenwire_core::dialect::generate::codec::{
    self, ClientMessage, Completion, CompletionTiming, Config, Control, ControlAction, ErrorCode,
    ErrorMessage, Feedback, FinishReason, Init, Logprob, ModelInfo, Options, RecoveryAction,
    ServerMessage, Status, Token, TokenTiming, Usage,
};
use tokenwire_core::testing::Harness;
use tokenwire_core::{ConnId, Dialect, HostConfig};

fn json_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("JSON numbers are finite", |x| x.is_finite())
            .prop_map(Value::from),
        ".{0,12}".prop_map(Value::String),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    json_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn json_object() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map("[a-z_]{1,12}", json_value(), 0..6)
        .prop_map(|m| m.into_iter().collect())
}

fn options() -> impl Strategy<Value = Options> {
    any::<[bool; 5]>().prop_map(|b| Options {
        echo_prompt: b[0],
        include_token_ids: b[1],
        include_logprobs: b[2],
        include_timing: b[3],
        include_generated_text: b[4],
    })
}

fn client_message() -> impl Strategy<Value = ClientMessage> {
    let config = (
        any::<String>(),
        proptest::option::of(any::<String>()),
        proptest::option::of(json_object()),
        options(),
    )
        .prop_map(|(prompt, model, parameters, options)| {
            ClientMessage::Config(Config {
                prompt,
                model,
                parameters,
                options,
            })
        });
    let control = (
        prop::sample::select(ControlAction::ALL.to_vec()),
        proptest::option::of(json_object()),
    )
        .prop_map(|(action, parameters)| ClientMessage::Control(Control { action, parameters }));
    let feedback = (
        -1.0f64..=1.0,
        proptest::option::of(".{0,200}"),
        proptest::option::of(any::<u64>()),
    )
        .prop_map(|(rating, text, position)| {
            ClientMessage::Feedback(Feedback {
                rating,
                text,
                position,
            })
        });
    prop_oneof![config, control, feedback]
}

fn finish() -> impl Strategy<Value = FinishReason> {
    prop::sample::select(vec![
        FinishReason::Length,
        FinishReason::Stop,
        FinishReason::Cancelled,
        FinishReason::Timeout,
    ])
}

fn millis() -> impl Strategy<Value = f64> {
    0.0f64..1.0e7
}

fn server_message() -> impl Strategy<Value = ServerMessage> {
    let init = (
        any::<String>(),
        any::<String>(),
        any::<String>(),
        any::<u32>(),
        any::<String>(),
    )
        .prop_map(|(request_id, model, version, max_tokens, quantization)| {
            ServerMessage::Init(Init {
                request_id,
                model,
                model_info: ModelInfo {
                    version,
                    max_tokens,
                    quantization,
                },
            })
        });
    let logprob = (
        any::<String>(),
        -1.0e4f32..=0.0,
        proptest::option::of(any::<u32>()),
    )
        .prop_map(|(token, logprob, token_id)| Logprob {
            token,
            logprob,
            token_id,
        });
    let token = (
        any::<String>(),
        proptest::option::of(any::<u32>()),
        proptest::option::of(prop::collection::vec(logprob, 1..6)),
        proptest::option::of((millis(), millis())),
        proptest::option::of(any::<String>()),
        proptest::option::of(finish()),
    )
        .prop_map(
            |(token, token_id, logprobs, timing, generated_text, finish_reason)| {
                ServerMessage::Token(Token {
                    token,
                    token_id,
                    logprobs,
                    timing: timing.map(|(token_ms, total_ms)| TokenTiming { token_ms, total_ms }),
                    generated_text,
                    finished: finish_reason.is_some(),
                    finish_reason,
                })
            },
        );
    let completion = (
        any::<String>(),
        any::<String>(),
        finish(),
        (0u32..1 << 20, 0u32..1 << 20),
        proptest::option::of((proptest::option::of(millis()), millis())),
    )
        .prop_map(
            |(request_id, generated_text, finish_reason, (p, c), timing)| {
                ServerMessage::Completion(Completion {
                    request_id,
                    generated_text,
                    finish_reason,
                    usage: Usage {
                        prompt_tokens: p,
                        completion_tokens: c,
                        total_tokens: p + c,
                    },
                    timing: timing.map(|(first_token_ms, total_ms)| CompletionTiming {
                        first_token_ms,
                        total_ms,
                        cached_tokens: p / 2,
                    }),
                })
            },
        );
    let error = (
        prop::sample::select(vec![
            ErrorCode::InvalidRequest,
            ErrorCode::ContextLengthExceeded,
            ErrorCode::MemoryPressure,
            ErrorCode::InternalError,
            ErrorCode::ModelLoadingError,
            ErrorCode::ContentFilter,
            ErrorCode::Timeout,
            ErrorCode::RateLimited,
        ]),
        any::<String>(),
        any::<bool>(),
        prop::sample::select(vec![
            RecoveryAction::Retry,
            RecoveryAction::ReduceMaxTokens,
            RecoveryAction::ShortenPrompt,
            RecoveryAction::None,
        ]),
        proptest::option::of(any::<String>()),
        proptest::option::of(any::<String>()),
    )
        .prop_map(
            |(error, message, recoverable, recovery_action, request_id, generated_text)| {
                ServerMessage::Error(ErrorMessage {
                    error,
                    message,
                    recoverable,
                    recovery_action,
                    request_id,
                    generated_text,
                })
            },
        );
    let status = prop_oneof![
        any::<String>().prop_map(|request_id| Status::Paused { request_id }),
        any::<String>().prop_map(|request_id| Status::Resumed { request_id }),
        (any::<String>(), json_object()).prop_map(|(request_id, parameters)| Status::Modified {
            request_id,
            parameters
        }),
        proptest::option::of(any::<String>())
            .prop_map(|request_id| Status::FeedbackReceived { request_id }),
        (any::<u32>(), any::<String>()).prop_map(|(position, request_id)| Status::Queued {
            position,
            request_id
        }),
        (
            0.0f32..=1.0,
            any::<String>(),
            proptest::option::of(0.0f64..1.0e5)
        )
            .prop_map(|(progress, message, eta_seconds)| Status::ModelLoading {
                progress,
                message,
                eta_seconds
            }),
    ]
    .prop_map(ServerMessage::Status);
    prop_oneof![init, token, completion, error, status]
}

/// A generate connection that has started a generation (so later frames are
/// not "first").
fn connected() -> (Harness, ConnId) {
    let mut h = Harness::new(HostConfig::default(), "abc ", 3);
    let c = h.open(1, Dialect::Generate);
    h.send(
        c,
        json!({"type": "config", "prompt": "hi", "parameters": {"max_tokens": 4}}),
    );
    h.run(10);
    assert_eq!(h.of_type(c, "completion").len(), 1, "setup generation ran");
    h.frames.clear();
    (h, c)
}

/// Asserts that the only reply to a frame the decoder rejected is one
/// recoverable `invalid_request` naming the decoder's complaint, and that the
/// connection stays open.
fn assert_rejected(h: &Harness, c: ConnId, err: &codec::DecodeError) {
    let got = h.received(c);
    assert_eq!(got.len(), 1, "one reply: {got:?}");
    assert_eq!(got[0]["type"], "error");
    assert_eq!(got[0]["error"], "invalid_request");
    assert_eq!(got[0]["recoverable"], true);
    assert_eq!(got[0]["message"], err.message.as_str());
    assert!(!err.message.is_empty());
    assert!(!h.closes.contains_key(&c), "connection stays open");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn client_messages_round_trip(msg in client_message()) {
        let text = codec::encode_client(&msg);
        prop_assert_eq!(codec::decode_client(&text), Ok(msg));
    }

    #[test]
    fn server_messages_round_trip(msg in server_message()) {
        let text = codec::encode_server(&msg);
        let back = codec::decode_server(&text);
        prop_assert_eq!(back, Ok(msg), "{}", text);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_get_invalid_request(
        bytes in prop::collection::vec(any::<u8>(), 0..256)
    ) {
        let text = String::from_utf8_lossy(&bytes);
        let decoded = codec::decode_client(&text);
        let (mut h, c) = connected();
        h.send_raw(c, &text);
        match decoded {
            Err(e) => assert_rejected(&h, c, &e),
            // A byte string that happens to be a valid message gets a reply of
            // the dialect, never a close.
            Ok(_) => prop_assert!(!h.closes.contains_key(&c)),
        }
    }

    #[test]
    fn arbitrary_json_never_panics_and_gets_invalid_request(v in json_value()) {
        let text = v.to_string();
        let decoded = codec::decode_client(&text);
        let (mut h, c) = connected();
        h.send_raw(c, &text);
        match decoded {
            Err(e) => assert_rejected(&h, c, &e),
            Ok(_) => prop_assert!(!h.closes.contains_key(&c)),
        }
    }

    /// Objects with a real message type and arbitrary other fields reach the
    /// field checks; each is decoded or rejected with a message naming a field.
    #[test]
    fn typed_objects_with_arbitrary_fields_are_decoded_or_named(
        kind in prop::sample::select(vec!["config", "control", "feedback"]),
        fields in prop::collection::btree_map(
            prop::sample::select(vec![
                "prompt", "model", "parameters", "options", "action", "rating", "text",
                "position", "extra",
            ]),
            json_value(),
            0..6,
        ),
    ) {
        let mut obj: Map<String, Value> =
            fields.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        obj.insert("type".into(), kind.into());
        let text = Value::Object(obj).to_string();
        match codec::decode_client(&text) {
            Ok(msg) => {
                // What decodes re-encodes to a frame that decodes the same.
                prop_assert_eq!(codec::decode_client(&codec::encode_client(&msg)), Ok(msg));
            }
            Err(e) => {
                prop_assert_eq!(e.kind, Some(kind));
                prop_assert!(e.message.contains('`'), "names the field: {}", e.message);
                let (mut h, c) = connected();
                h.send_raw(c, &text);
                assert_rejected(&h, c, &e);
            }
        }
    }

    /// A first frame that is not a valid `config` is the one case that closes
    /// the connection (1008), after a non-recoverable error.
    #[test]
    fn a_bad_first_frame_is_an_error_then_close_1008(v in json_value()) {
        let text = v.to_string();
        prop_assume!(!matches!(codec::decode_client(&text), Ok(ClientMessage::Config(_))));
        let kind_is_config = matches!(
            codec::decode_client(&text),
            Err(codec::DecodeError { kind: Some("config"), .. })
        );
        let mut h = Harness::new(HostConfig::default(), "abc ", 3);
        let c = h.open(1, Dialect::Generate);
        h.send_raw(c, &text);
        let got = h.received(c);
        prop_assert_eq!(got.len(), 1);
        prop_assert_eq!(&got[0]["error"], "invalid_request");
        if kind_is_config {
            // A malformed config is an ordinary recoverable error.
            prop_assert_eq!(&got[0]["recoverable"], true);
            prop_assert!(!h.closes.contains_key(&c));
        } else {
            prop_assert_eq!(&got[0]["recoverable"], false);
            prop_assert_eq!(h.closes.get(&c).map(|c| c.0), Some(1008));
        }
    }
}

#[test]
fn every_server_message_the_host_sends_decodes() {
    // A full session through the Host: init, tokens with every option,
    // statuses, feedback ack, completion and errors all decode with the codec.
    let mut h = Harness::new(HostConfig::default(), "abc ", 3);
    let c = h.open(1, Dialect::Generate);
    h.send(
        c,
        json!({"type": "config", "prompt": "hi", "parameters": {"max_tokens": 6},
               "options": {"include_token_ids": true, "include_logprobs": true,
                           "include_timing": true, "include_generated_text": true}}),
    );
    h.step();
    h.send(c, json!({"type": "control", "action": "pause"}));
    h.send(c, json!({"type": "control", "action": "resume"}));
    h.send(
        c,
        json!({"type": "control", "action": "modify", "parameters": {"temperature": 0.5}}),
    );
    h.send(c, json!({"type": "feedback", "rating": 0.5}));
    h.send(c, json!({"type": "control", "action": "bogus"}));
    h.run(20);
    let frames = h.received(c);
    let mut kinds = Vec::new();
    for f in frames {
        let msg = codec::decode_server(&f.to_string());
        assert!(msg.is_ok(), "{f} did not decode: {msg:?}");
        kinds.push(f["type"].as_str().unwrap_or("").to_string());
    }
    for k in ["init", "token", "status", "error", "completion"] {
        assert!(kinds.iter().any(|x| x == k), "saw a {k}: {kinds:?}");
    }
}

#[test]
fn a_server_float_beyond_f32_is_an_error_not_infinity() {
    // JSON has no infinity; a value that would become one as f32 must not
    // decode into a message that cannot be encoded again.
    let text = r#"{"type":"status","operation":"model_loading","progress":1e39,"message":"","eta_seconds":null}"#;
    let e = codec::decode_server(text).expect_err("1e39 is no f32");
    assert!(e.message.contains("`progress`"), "{}", e.message);
    let text = r#"{"type":"token","token":"a","logprobs":[{"token":"a","logprob":-1e40}],"finish_reason":null,"finished":false}"#;
    let e = codec::decode_server(text).expect_err("-1e40 is no f32");
    assert!(e.message.contains("`logprobs.logprob`"), "{}", e.message);
}

/// The metrics label of an error (`ErrorCode::as_str`) is written by hand
/// beside serde's spelling on the wire; they must never drift apart.
#[test]
fn error_code_labels_are_the_wire_spelling() {
    for (i, code) in ErrorCode::ALL.into_iter().enumerate() {
        // Adding a variant breaks this match until it is placed in `ALL`.
        let declared = match code {
            ErrorCode::InvalidRequest => 0,
            ErrorCode::ContextLengthExceeded => 1,
            ErrorCode::MemoryPressure => 2,
            ErrorCode::InternalError => 3,
            ErrorCode::ModelLoadingError => 4,
            ErrorCode::ContentFilter => 5,
            ErrorCode::Timeout => 6,
            ErrorCode::RateLimited => 7,
        };
        assert_eq!(declared, i, "ErrorCode::ALL is in declaration order");
        let wire = serde_json::to_value(code).expect("serialises");
        assert_eq!(wire, json!(code.as_str()), "{code:?}");
        let back: ErrorCode = serde_json::from_value(json!(code.as_str())).expect("decodes");
        assert_eq!(back, code);
    }
    for reason in [
        tokenwire_core::gen::FinishReason::Length,
        tokenwire_core::gen::FinishReason::Stop,
        tokenwire_core::gen::FinishReason::Cancelled,
        tokenwire_core::gen::FinishReason::Timeout,
    ] {
        let wire = serde_json::to_value(FinishReason::from(reason)).expect("serialises");
        assert_eq!(wire, json!(reason.as_str()), "{reason:?}");
    }
}
