//! A panic hook that reports where a thread panicked and never what it said.
//!
//! The default hook prints the panic's message, and the messages of panics
//! deep in parsing or tokenizing code can quote a few hundred bytes of
//! their input (`byte index 7 is not a char boundary; it is inside 'é' ...
//! of \`...\``): client text, which must never reach a log (PROTOCOLS.md).

/// Replaces the process's panic hook: each panic is reported to `report` as
/// one line naming the thread and the source location, without its message.
pub fn install(report: impl Fn(&str) + Send + Sync + 'static) {
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current();
        let name = thread.name().unwrap_or("unnamed");
        let at = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_else(|| "an unknown location".into());
        report(&format!(
            "thread '{name}' panicked at {at} (its message is withheld: it may quote client text)"
        ));
    }));
}
