//! Property tests of the `batch` dialect's codec: a payload and a server
//! frame each come back from their encoder as they went in (custom clients
//! and the simulator build their payloads with `encode_payload`, and read
//! the Host's frames with `decode_events`).

use proptest::prelude::*;
use serde_json::{Map, Value};
use tokenwire_core::dialect::batch::codec::{
    decode_events, decode_payload, encode_events, encode_payload, Event, EventKind, Payload,
    PromptEntry,
};

fn entry() -> impl Strategy<Value = PromptEntry> {
    (".{1,10}", ".{0,16}").prop_map(|(request_id, prompt)| PromptEntry { request_id, prompt })
}

fn generation_config() -> impl Strategy<Value = Map<String, Value>> {
    prop::collection::btree_map(
        prop::sample::select(vec!["temperature", "top_k", "max_new_tokens", "num_beams"]),
        prop_oneof![
            any::<u16>().prop_map(Value::from),
            any::<bool>().prop_map(Value::from),
        ],
        0..3,
    )
    .prop_map(|m| m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
}

fn payload() -> impl Strategy<Value = Payload> {
    (
        prop::collection::vec(entry(), 1..5),
        any::<bool>(),
        any::<bool>(),
        generation_config(),
    )
        .prop_map(
            |(prompts, only_new_tokens, stream_response, generation_config)| Payload {
                prompts,
                only_new_tokens,
                stream_response,
                generation_config,
            },
        )
}

fn kind() -> impl Strategy<Value = EventKind> {
    prop_oneof![
        Just(EventKind::Accepted),
        Just(EventKind::Started),
        ".{0,8}".prop_map(|text| EventKind::Initialized { text }),
        ".{0,8}".prop_map(|text| EventKind::Progress { text }),
        (".{0,8}", any::<bool>(), any::<u32>(), 0.0f64..1e6).prop_map(
            |(text, is_eos, new_tokens_count, execution_time)| EventKind::Complete {
                text,
                is_eos,
                new_tokens_count,
                execution_time,
            }
        ),
        ".{1,8}".prop_map(|error| EventKind::Error { error }),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    (prop::option::of(".{1,8}"), kind()).prop_map(|(request_id, kind)| Event {
        // Only an ERROR may name no prompt.
        request_id: match &kind {
            EventKind::Error { .. } => request_id,
            _ => Some(request_id.unwrap_or_else(|| "r".into())),
        },
        kind,
    })
}

proptest! {
    #[test]
    fn a_payload_round_trips(p in payload()) {
        let text = encode_payload(&p);
        prop_assert_eq!(decode_payload(&text, p.prompts.len()), Ok(p));
    }

    #[test]
    fn server_frames_round_trip(events in prop::collection::vec(event(), 1..5)) {
        let text = encode_events(&events);
        prop_assert_eq!(decode_events(&text), Ok(events));
    }
}

#[test]
fn a_payload_past_its_bound_is_refused_naming_no_prompt() {
    let p = Payload {
        prompts: vec![
            PromptEntry {
                request_id: "a".into(),
                prompt: "x".into(),
            },
            PromptEntry {
                request_id: "b".into(),
                prompt: "y".into(),
            },
        ],
        only_new_tokens: false,
        stream_response: false,
        generation_config: Map::new(),
    };
    let e = decode_payload(&encode_payload(&p), 1).expect_err("two of one");
    assert!(e.request_ids.is_empty(), "{e:?}");
    assert!(e.message.contains("more than the 1"), "{}", e.message);
}
