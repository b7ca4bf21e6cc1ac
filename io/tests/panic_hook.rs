//! The binary's panic hook (its own test binary: a panic hook is global).

use std::sync::{Arc, Mutex};

#[test]
fn a_panic_is_reported_by_place_and_never_by_its_message() {
    let lines: Arc<Mutex<Vec<String>>> = Arc::default();
    let sink = lines.clone();
    tokenwire_io::panic_hook::install(move |l| {
        if let Ok(mut v) = sink.lock() {
            v.push(l.to_string());
        }
    });
    let client_text = "my secret diagnosis é";
    let panicked = std::thread::Builder::new()
        .name("text-job".into())
        .spawn(move || {
            // What slicing client text at a wrong index says, text included.
            let cut = client_text.len() - 1;
            client_text[..cut].len()
        })
        .expect("spawn")
        .join()
        .is_err();
    let _ = std::panic::take_hook();
    assert!(panicked);
    let lines = lines.lock().map(|v| v.clone()).unwrap_or_default();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].contains("thread 'text-job' panicked at"),
        "{}",
        lines[0]
    );
    assert!(lines[0].contains("panic_hook.rs"), "{}", lines[0]);
    assert!(!lines[0].contains("secret"), "{}", lines[0]);
}
