//! Property tests of the `cai` dialect's codec: every message round-trips
//! both ways, and arbitrary frames on an authenticated connection never panic,
//! always get one `ERROR` (or a request started) and leave the connection open.

use proptest::prelude::*;
use serde_json::{json, Map, Value};
use tokenwire_core::dialect::cai::codec::{
    self, ClientMessage, Completion, ErrorCode, ServerMessage, Usage,
};
use tokenwire_core::keys::{hash_key, ApiKey, KeyRing};
use tokenwire_core::testing::Harness;
use tokenwire_core::{ChatMessage, Dialect, HostConfig, Role};

fn messages() -> impl Strategy<Value = Vec<ChatMessage>> {
    prop::collection::vec(
        (
            prop_oneof![Just(Role::User), Just(Role::Assistant), Just(Role::System)],
            ".{0,12}",
        )
            .prop_map(|(role, content)| ChatMessage::new(role, content)),
        0..4,
    )
}

fn options() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(
        prop::sample::select(vec!["temperature", "maxTokens", "stream", "window", "topP"]),
        prop_oneof![
            any::<u16>().prop_map(Value::from),
            any::<bool>().prop_map(Value::from)
        ],
        0..3,
    )
    .prop_map(|m| m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn id() -> impl Strategy<Value = String> {
    ".{1,12}"
}

fn client() -> impl Strategy<Value = ClientMessage> {
    prop_oneof![
        (
            id(),
            ".{0,20}",
            proptest::option::of(".{1,8}"),
            options(),
            proptest::option::of(id()),
            proptest::option::of(messages())
        )
            .prop_map(
                |(request_id, prompt, model, options, conversation_id, context)| {
                    ClientMessage::Completion(Completion {
                        request_id,
                        prompt,
                        model,
                        options,
                        conversation_id,
                        context,
                    })
                }
            ),
        id().prop_map(|request_id| ClientMessage::Interrupted { request_id }),
        (id(), proptest::option::of(any::<u64>())).prop_map(|(request_id, last_received_index)| {
            ClientMessage::AwaitMore {
                request_id,
                last_received_index,
            }
        }),
        (id(), any::<u64>()).prop_map(|(request_id, sentence_index)| {
            ClientMessage::SentenceCompleted {
                request_id,
                sentence_index,
            }
        }),
    ]
}

fn server() -> impl Strategy<Value = ServerMessage> {
    let code = prop::sample::select(ErrorCode::ALL.to_vec());
    prop_oneof![
        (id(), ".{0,8}").prop_map(|(request_id, timestamp)| ServerMessage::StreamStart {
            request_id,
            timestamp
        }),
        (id(), ".{0,8}", any::<u64>()).prop_map(|(request_id, content, index)| {
            ServerMessage::ContentChunk {
                request_id,
                content,
                index,
            }
        }),
        (id(), ".{0,8}", any::<u64>()).prop_map(|(request_id, sentence, sentence_index)| {
            ServerMessage::SentenceBoundary {
                request_id,
                sentence,
                sentence_index,
            }
        }),
        (
            id(),
            ".{0,8}",
            any::<u16>(),
            any::<u16>(),
            prop::sample::select(vec!["stop", "length", "interrupted"])
        )
            .prop_map(|(request_id, full_content, p, c, reason)| {
                ServerMessage::StreamComplete {
                    request_id,
                    full_content,
                    usage: Usage {
                        prompt_tokens: u32::from(p),
                        completion_tokens: u32::from(c),
                    },
                    model: "m".into(),
                    finish_reason: reason.into(),
                }
            }),
        (id(), ".{0,8}", any::<u32>()).prop_map(
            |(request_id, partial_content, tokens_generated)| {
                ServerMessage::InterruptedAck {
                    request_id,
                    partial_content,
                    tokens_generated,
                }
            }
        ),
        (proptest::option::of(id()), code, ".{0,8}", any::<u32>()).prop_map(
            |(request_id, code, message, n)| {
                let mut details = Map::new();
                details.insert("retryAfterMs".into(), json!(n));
                ServerMessage::Error {
                    request_id,
                    code,
                    message,
                    details,
                }
            }
        ),
    ]
}

fn hostile() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        Just(json!(null)),
        Just(json!(-1)),
        Just(json!("")),
        Just(json!([])),
        Just(json!({})),
        Just(json!(1e300)),
        ".{0,6}".prop_map(Value::from),
    ];
    prop_oneof![
        ".{0,40}",
        (
            prop::sample::select(vec![
                "COMPLETION",
                "INTERRUPTED",
                "AWAIT_MORE",
                "SENTENCE_COMPLETED",
                "X"
            ]),
            field.clone(),
            field.clone(),
            field,
        )
            .prop_map(|(t, rid, prompt, opt)| json!({
                "type": t, "requestId": rid,
                "payload": {"prompt": prompt, "options": {"temperature": opt, "window": opt},
                            "lastReceivedIndex": opt, "sentenceIndex": opt, "context": opt}
            })
            .to_string()),
    ]
}

proptest! {
    #[test]
    fn client_messages_round_trip(m in client()) {
        prop_assert_eq!(codec::decode_client(&codec::encode_client(&m)), Ok(m));
    }

    #[test]
    fn server_messages_round_trip(m in server()) {
        // The request a message is about is the one its frame names.
        let v: Value = serde_json::from_str(&codec::encode_server(&m)).expect("json");
        prop_assert_eq!(m.request_id(), v["requestId"].as_str());
        prop_assert_eq!(codec::decode_server(&codec::encode_server(&m)), Ok(m));
    }

    #[test]
    fn hostile_frames_get_an_error_or_a_request_and_the_connection_stays(frames in prop::collection::vec(hostile(), 1..6)) {
        let ring = KeyRing::new(vec![ApiKey {
            name: "k".into(),
            sha256: hash_key("k"),
            orgs: vec!["o".into()],
            requests_per_minute: None,
            tokens_per_minute: None,
        }]).expect("ring");
        let mut h = Harness::new(HostConfig { keys: Some(ring), ..HostConfig::default() }, "abc. ", 1);
        let c = h.open_with(1, Dialect::Cai, "authorization=k&orgId=o");
        for f in &frames {
            let before = h.received(c).len();
            h.send_raw(c, f);
            let got = &h.received(c)[before..];
            for v in got {
                let text = v.to_string();
                prop_assert!(codec::decode_server(&text).is_ok(), "off-contract frame {}", text);
            }
            h.run(30);
        }
        prop_assert!(h.closes.is_empty(), "closed by {:?}", frames);
    }
}
