//! Job verification: the shell's answer to the core's
//! [`Output::VerifyJob`](tokenwire_core::Output::VerifyJob). A deployment
//! that sells tokens checks the job against its own service (a payment
//! contract, a quota database) by implementing [`JobVerifier`]; the default,
//! [`AcceptAll`], accepts every job with the budget `--job-token-budget` gives.

use tokenwire_core::{Input, JobCheck, JobCheckId, JobGrant};

use crate::channel::{DriverHandle, DriverMsg};

/// Decides whether a job may use this host, and how many tokens it may use.
pub trait JobVerifier: Send + Sync + 'static {
    /// Answers `check` through `reply`, now or later (a verifier that asks a
    /// remote service spawns a task and replies from there). The client's
    /// frames wait until it does, so every check must be answered.
    fn verify(&self, check: JobCheck, reply: VerdictReply);
}

/// Where a verifier sends its verdict.
pub struct VerdictReply {
    check: JobCheckId,
    driver: DriverHandle,
}

impl VerdictReply {
    pub(crate) fn new(check: JobCheckId, driver: DriverHandle) -> VerdictReply {
        VerdictReply { check, driver }
    }

    /// Hands the verdict to the Host: what the job may use, or why it is
    /// refused (told to the client, so no internal detail).
    pub fn send(self, verdict: Result<JobGrant, String>) {
        self.driver.send_now(DriverMsg::Input(Input::JobVerified {
            check: self.check,
            verdict,
        }));
    }
}

/// Accepts every job, each with the same token budget (`None`: no cap).
#[derive(Debug, Clone, Copy, Default)]
pub struct AcceptAll {
    /// Tokens each job may use on this host.
    pub token_budget: Option<u64>,
}

impl JobVerifier for AcceptAll {
    fn verify(&self, _check: JobCheck, reply: VerdictReply) {
        reply.send(Ok(JobGrant {
            token_budget: self.token_budget,
        }));
    }
}
