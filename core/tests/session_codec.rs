//! Property tests of the `session` dialect's codec and context fitting: every
//! message round-trips, arbitrary frames never panic and get
//! `invalid_request` with the connection open, and the prompt built from a
//! conversation is the newest messages that fit.

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use tokenwire_core::dialect::session::codec::{
    self, ClientMessage, ErrorCode, ErrorMessage, Inference, Prompt, Response, ServerMessage,
    SessionEnded, SessionReady, SessionStart, StreamChunk, SAMPLING_KEYS,
};
use tokenwire_core::testing::{ByteCodec, Harness};
use tokenwire_core::{
    ChatMessage, Dialect, HostConfig, Role, SharedCodec, TextCodec, TextJob, TextJobId, TextWork,
    CONTEXT_TOO_LONG,
};

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::User), Just(Role::Assistant), Just(Role::System)]
}

fn messages(max: usize) -> impl Strategy<Value = Vec<ChatMessage>> {
    prop::collection::vec(
        (role(), ".{0,16}").prop_map(|(role, content)| ChatMessage::new(role, content)),
        0..max,
    )
}

fn sampling() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(
        prop::sample::select(SAMPLING_KEYS.to_vec()),
        prop_oneof![
            any::<u32>().prop_map(Value::from),
            any::<bool>().prop_map(Value::from)
        ],
        0..4,
    )
    .prop_map(|m| m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn id() -> impl Strategy<Value = String> {
    ".{1,12}"
}

fn client_message() -> impl Strategy<Value = ClientMessage> {
    let start = || {
        (
            id(),
            id(),
            messages(6),
            proptest::option::of(id()),
            proptest::option::of(any::<u64>()),
        )
    };
    prop_oneof![
        start().prop_map(|(session_id, job_id, conversation_context, model, _)| {
            ClientMessage::SessionInit(SessionStart {
                session_id,
                job_id,
                conversation_context,
                model,
                last_message_index: None,
                public_key: None,
            })
        }),
        start().prop_map(|(session_id, job_id, conversation_context, model, last)| {
            ClientMessage::SessionResume(SessionStart {
                public_key: Some(format!("{job_id}-key")),
                session_id,
                job_id,
                conversation_context,
                model,
                last_message_index: Some(last.unwrap_or(0)),
            })
        }),
        (
            id(),
            ".{0,20}",
            any::<u64>(),
            any::<bool>(),
            sampling(),
            proptest::option::of("[0-9a-f]{128}")
        )
            .prop_map(
                |(session_id, content, message_index, stream, sampling, signature)| {
                    ClientMessage::Prompt(Prompt {
                        session_id,
                        content,
                        message_index,
                        stream,
                        sampling,
                        signature,
                    })
                }
            ),
        id().prop_map(|session_id| ClientMessage::SessionEnd { session_id }),
        (
            ".{0,20}",
            messages(4),
            proptest::option::of(id()),
            proptest::option::of(id()),
            any::<bool>(),
            sampling()
        )
            .prop_map(
                |(prompt, conversation_context, session_id, model, stream, sampling)| {
                    ClientMessage::Inference(Inference {
                        prompt,
                        conversation_context,
                        session_id,
                        model,
                        stream,
                        sampling,
                    })
                }
            ),
    ]
}

fn code() -> impl Strategy<Value = ErrorCode> {
    prop::sample::select(vec![
        ErrorCode::InvalidRequest,
        ErrorCode::UnknownSession,
        ErrorCode::SessionExists,
        ErrorCode::MessageIndexMismatch,
        ErrorCode::ContextLengthExceeded,
        ErrorCode::TokenBudgetExhausted,
        ErrorCode::RateLimited,
        ErrorCode::InternalError,
    ])
}

fn server_message() -> impl Strategy<Value = ServerMessage> {
    prop_oneof![
        (id(), any::<u64>(), any::<u32>(), any::<u32>(), any::<u64>()).prop_map(
            |(session_id, message_count, context_tokens, truncated_messages, timestamp)| {
                ServerMessage::SessionReady(SessionReady {
                    session_id,
                    message_count,
                    context_tokens,
                    truncated_messages,
                    timestamp,
                })
            }
        ),
        (id(), ".{0,8}", any::<u64>(), any::<u64>()).prop_map(
            |(session_id, content, message_index, timestamp)| ServerMessage::StreamChunk(
                StreamChunk {
                    session_id,
                    content,
                    message_index,
                    timestamp
                }
            )
        ),
        (
            id(),
            ".{0,8}",
            any::<u32>(),
            any::<u64>(),
            "stop|length|cancelled",
            any::<u64>()
        )
            .prop_map(
                |(session_id, content, tokens_used, message_index, finish_reason, timestamp)| {
                    ServerMessage::Response(Response {
                        session_id,
                        content,
                        tokens_used,
                        message_index,
                        finish_reason,
                        timestamp,
                    })
                }
            ),
        (id(), any::<u64>()).prop_map(|(session_id, timestamp)| ServerMessage::SessionEnded(
            SessionEnded {
                session_id,
                timestamp
            }
        )),
        (
            proptest::option::of(id()),
            code(),
            ".{0,12}",
            proptest::option::of(any::<u64>()),
            any::<bool>(),
            any::<u64>()
        )
            .prop_map(
                |(session_id, code, message, expected, recoverable, timestamp)| {
                    ServerMessage::Error(ErrorMessage {
                        session_id,
                        code,
                        message,
                        expected,
                        recoverable,
                        timestamp,
                    })
                }
            ),
    ]
}

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        ".{0,8}".prop_map(Value::String),
        prop::sample::select(vec![
            "session_init",
            "prompt",
            "session_resume",
            "session_end"
        ])
        .prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 32, 5, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "type",
                    "session_id",
                    "job_id",
                    "content",
                    "message_index",
                    "conversation_context",
                    "payload",
                    "role",
                    "x"
                ]),
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())),
        ]
    })
}

fn fit(
    messages: &[ChatMessage],
    max_messages: usize,
    max_tokens: u32,
) -> Result<tokenwire_core::Encoded, String> {
    TextJob {
        id: TextJobId(1),
        conn: tokenwire_core::ConnId(1),
        codec: SharedCodec(std::sync::Arc::new(ByteCodec)),
        work: TextWork::Chat {
            messages: messages.to_vec(),
            max_messages,
            max_tokens,
            tools: Vec::new(),
            template_kwargs: Default::default(),
        },
    }
    .run()
    .result
}

/// The messages kept when the `dropped` oldest non-system ones are left out.
fn kept(messages: &[ChatMessage], dropped: usize) -> Vec<ChatMessage> {
    let mut skip = dropped;
    messages
        .iter()
        .filter(|m| {
            if m.role != Role::System && skip > 0 {
                skip -= 1;
                false
            } else {
                true
            }
        })
        .cloned()
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn client_messages_round_trip(msg in client_message()) {
        let text = codec::encode_client(&msg);
        let back = codec::decode_frame(&text).expect("a frame");
        prop_assert_eq!(back, vec![Ok(msg)]);
    }

    /// `session_id()` names the session the message's frame names (none
    /// for an inference without one), and `kind()` its `type`.
    #[test]
    fn a_message_names_its_frames_session_and_type(msg in client_message()) {
        let v: Value = serde_json::from_str(&codec::encode_client(&msg)).expect("json");
        prop_assert_eq!(msg.session_id(), v["session_id"].as_str());
        prop_assert_eq!(Some(msg.kind()), v["type"].as_str());
    }

    #[test]
    fn server_messages_round_trip(msg in server_message()) {
        let text = codec::encode_server(&msg);
        prop_assert_eq!(codec::decode_server(&text), Ok(msg), "{}", text);
    }

    #[test]
    fn arbitrary_frames_never_panic_and_errors_keep_the_connection(v in json_value()) {
        let mut h = Harness::new(HostConfig::default(), "ab", 1);
        let c = h.open(1, Dialect::Session);
        h.send(c, v.clone());
        h.run(20);
        prop_assert!(!h.closes.contains_key(&c), "never closed: {}", v);
        for e in h.of_type(c, "error") {
            prop_assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()));
        }
    }

    #[test]
    fn the_fitted_prompt_is_the_fewest_drops_that_fit(
        msgs in messages(10),
        max_messages in 1usize..8,
        max_tokens in 1u32..80,
    ) {
        let others = msgs.iter().filter(|m| m.role != Role::System).count();
        let len = |k: usize| ByteCodec.encode_chat(&kept(&msgs, k)).expect("enc").len();
        match fit(&msgs, max_messages, max_tokens) {
            Ok(enc) => {
                let d = enc.dropped as usize;
                prop_assert_eq!(enc.ids.len(), len(d));
                prop_assert!(enc.ids.len() <= max_tokens as usize);
                prop_assert!(others - d <= max_messages);
                prop_assert!(d == 0 || others - d == max_messages || len(d - 1) > max_tokens as usize,
                    "one fewer drop would also fit");
                prop_assert!(d < others || others == 0, "the newest message is kept");
            }
            Err(e) => {
                prop_assert!(e.starts_with(CONTEXT_TOO_LONG), "{}", e);
                prop_assert!(len(others.saturating_sub(1)) > max_tokens as usize);
            }
        }
    }
}

#[test]
fn an_envelope_reads_its_payload_as_flat_fields() {
    let frame = json!({"type":"prompt","session_id":"s","timestamp":5,"payload":{"content":"c","message_index":3}});
    let got = codec::decode_frame(&frame.to_string()).expect("frame");
    let Ok(ClientMessage::Prompt(p)) = &got[0] else {
        panic!("a prompt: {got:?}")
    };
    assert_eq!(
        (
            p.session_id.as_str(),
            p.content.as_str(),
            p.message_index,
            p.stream
        ),
        ("s", "c", 3, true)
    );
    let bad = codec::decode_frame(r#"{"type":"prompt","payload":7}"#).expect("frame");
    assert!(bad[0]
        .as_ref()
        .is_err_and(|e| e.message.contains("payload")));
    assert!(codec::decode_frame("[]").is_err());
}

#[test]
fn error_codes_are_their_wire_spelling() {
    for code in [
        ErrorCode::InvalidRequest,
        ErrorCode::UnknownSession,
        ErrorCode::SessionExists,
        ErrorCode::MessageIndexMismatch,
        ErrorCode::ContextLengthExceeded,
        ErrorCode::TokenBudgetExhausted,
        ErrorCode::RateLimited,
        ErrorCode::InternalError,
    ] {
        assert_eq!(
            serde_json::to_value(code).expect("json"),
            Value::from(code.as_str())
        );
    }
}

#[test]
fn a_job_id_is_a_non_empty_string_or_an_integer() {
    let start = |job_id: Value| {
        codec::decode_value(&json!({
            "type": "session_init",
            "session_id": "s1",
            "job_id": job_id,
            "conversation_context": [],
        }))
    };
    let job = |m: ClientMessage| match m {
        ClientMessage::SessionInit(s) => s.job_id,
        other => panic!("not a session_init: {other:?}"),
    };
    assert_eq!(job(start(json!("j-1")).expect("a string")), "j-1");
    assert_eq!(job(start(json!(7)).expect("an integer")), "7");
    assert_eq!(job(start(json!(-3)).expect("a negative integer")), "-3");
    for bad in [json!(1.5), json!(""), json!(true), json!(null), json!([1])] {
        let err = start(bad.clone()).expect_err("refused");
        assert!(
            err.message.contains("job_id"),
            "{bad}: the error names the field: {}",
            err.message
        );
    }
}
