//! `cai_auth`: authentication at the opening follows the contract. Whether
//! a `cai` connection is refused, and with which code, is derived from its
//! query string and the run's keys file alone
//! ([`reference_auth`](super::view::reference_auth)), not from what the
//! client meant: no keys file 1008, a missing or unknown key 4001, no
//! `orgId` 4002, an organisation the key may not act for 4003. A refused
//! connection is closed in its opening event with exactly that code and gets
//! no frame at all; one with valid credentials is not closed at its opening
//! (but for 1001 once shutdown began) and never later with an
//! authentication code.

use tokenwire_core::Output;

use crate::invariants::{Check, Checker, Cur, Cx, EndState, Frame};

/// See the module docs.
#[derive(Debug, Default)]
pub struct CaiAuth;

impl Checker for CaiAuth {
    fn name(&self) -> &'static str {
        "cai_auth"
    }

    fn on_output(&mut self, cx: &Cx<'_>, out: &Output, _frame: Option<&Frame>) -> Check {
        match out {
            Output::Close { conn, code, reason } => {
                let Some(a) = cx.view.cai(conn) else {
                    return Ok(());
                };
                let at_open = cx.input == Cur::Open(*conn);
                if !at_open {
                    if (4001..=4003).contains(code) {
                        return Err(format!(
                            "{conn:?} closed with {code} ({reason:?}) after its opening"
                        ));
                    }
                    return Ok(());
                }
                if *code == 1001 && cx.view.shutdown_at.is_some() {
                    return Ok(());
                }
                match &a.auth {
                    Ok(who) => Err(format!(
                        "{conn:?} opened with valid credentials ({:?}: key {}, org {:?}) was closed with {code} ({reason:?})",
                        a.query, who.key, who.org
                    )),
                    Err(want) if want != code => Err(format!(
                        "{conn:?} opened with {:?} was closed with {code} ({reason:?}); the contract calls for {want}",
                        a.query
                    )),
                    Err(_) => Ok(()),
                }
            }
            Output::Send { conn, .. } => match cx.view.cai(conn).map(|a| &a.auth) {
                Some(Err(code)) => Err(format!(
                    "{conn:?}, refused at its opening ({code}), got a frame"
                )),
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }

    fn on_end(&mut self, cx: &Cx<'_>, _end: &EndState) -> Check {
        let Cur::Open(conn) = cx.input else {
            return Ok(());
        };
        let Some(c) = cx.view.conns.get(&conn) else {
            return Ok(());
        };
        match c.cai.as_ref().map(|a| (&a.auth, &a.query)) {
            Some((Err(code), query)) if !c.closed => Err(format!(
                "{conn:?} opened with {query:?} calls for close {code} but is still open"
            )),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants::testkit::cai_kit;
    use serde_json::json;
    use tokenwire_core::ConnId;

    fn close(code: u16) -> Output {
        Output::Close {
            conn: ConnId(1),
            code,
            reason: "r".into(),
        }
    }

    #[test]
    fn refusals_with_the_wrong_code_or_none_are_caught() {
        let mut k = cai_kit(Box::new(CaiAuth));
        k.open_query(1, "authorization=sk-nope&orgId=org_a")
            .expect("open");
        let e = k.out(close(4003)).expect_err("wrong code");
        assert_eq!(e.invariant, "cai_auth");
        assert!(e.detail.contains("4001"), "{}", e.detail);

        let mut k = cai_kit(Box::new(CaiAuth));
        k.open_query(1, "authorization=Bearer%20sk-test")
            .expect("open");
        let e = k.end().expect_err("left open");
        assert!(e.detail.contains("4002"), "{}", e.detail);

        let mut k = cai_kit(Box::new(CaiAuth));
        k.open_query(1, "authorization=sk-test&orgId=org_b")
            .expect("open");
        let e = k.send(1, json!({"type": "ERROR"})).expect_err("a frame");
        assert!(e.detail.contains("got a frame"), "{}", e.detail);
        k.out(close(4003)).expect("the right code");
    }

    #[test]
    fn a_valid_connection_closed_at_its_opening_is_caught() {
        let mut k = cai_kit(Box::new(CaiAuth));
        k.open_query(1, "authorization=bearer+sk-test&orgId=org_a")
            .expect("open");
        let e = k.out(close(4001)).expect_err("valid");
        assert!(e.detail.contains("valid credentials"), "{}", e.detail);
        let mut k = cai_kit(Box::new(CaiAuth));
        k.open_query(1, "orgId=org_a&authorization=sk-test")
            .expect("open");
        k.end().expect("open and fine");
        k.input(tokenwire_core::Input::Timeout).expect("input");
        let e = k.out(close(4001)).expect_err("later");
        assert!(e.detail.contains("after its opening"), "{}", e.detail);
    }
}
