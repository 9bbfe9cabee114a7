//! Authentication: a cluster with auth on trades a user and password for a token that every
//! later request carries.
//!
//! With [`EtcdProtocol::with_auth`], the first request is `auth/authenticate` with the user
//! and password; every later request carries the token ([`super::Request::authorization`],
//! the `Authorization` header). While there is no token, everything else waits, and one
//! authenticate request is out at a time; a refused one fails what waited for it (the engine
//! retries within its budget) and is tried again after a pause. A request refused for its
//! token (expired, or the member forgot it) is a transport error for the engine, and the
//! next request authenticates again. Nothing here shows the password or the token in `Debug`
//! (`redact.rs`).

use serde_json::{Value, json};

use super::json::{self, ReplyError};
use super::{EtcdProtocol, MS, Op, RequestKind, paths};
use crate::Client;

/// Longest user name or password accepted, in bytes.
pub const MAX_CREDENTIAL_LEN: usize = 256;
/// gRPC code of a missing, expired or invalid auth token.
const CODE_UNAUTHENTICATED: i64 = 16;
/// After a failed authentication, how long before the next attempt.
const REAUTH_AFTER_NS: u64 = 500 * MS;

/// Credentials and the token they got (`Debug` shows the user only).
pub(super) struct Auth {
    pub(super) user: String,
    pub(super) password: String,
    pub(super) token: String,
    /// The authenticate request, while one is out.
    pub(super) request: Option<u64>,
    pub(super) retry_at: u64,
}

impl EtcdProtocol {
    /// Creates the protocol for a cluster with authentication on: before anything else it
    /// trades `user` and `password` for a token (`/v3/auth/authenticate`), which every request
    /// then carries; a request refused for its token gets a new one. Empty or overlong
    /// credentials are refused.
    pub fn with_auth(user: &str, password: &str) -> Result<Self, crate::Error> {
        if user.is_empty() || user.len() > MAX_CREDENTIAL_LEN || password.len() > MAX_CREDENTIAL_LEN
        {
            return Err(crate::Error::InvalidConfig(
                "etcd user must be 1..=256 bytes and its password at most 256",
            ));
        }
        let mut p = Self::new();
        p.auth = Some(Auth {
            user: user.to_owned(),
            password: password.to_owned(),
            token: String::new(),
            request: None,
            retry_at: 0,
        });
        Ok(p)
    }

    /// Whether requests carry a token now (always true without authentication).
    pub fn is_authenticated(&self) -> bool {
        self.auth.as_ref().is_none_or(|a| !a.token.is_empty())
    }

    /// With no token: the authenticate request to send now, ahead of the queue it unblocks
    /// (`None` while one is out, during the pause after a refusal, or with nothing waiting).
    pub(super) fn authenticate(&mut self, now: u64) -> Option<u64> {
        let a = self.auth.as_ref()?;
        if a.request.is_some() || now < a.retry_at || self.out.queue_is_empty() {
            return None;
        }
        let body = json!({ "name": a.user, "password": a.password });
        let id = self.push(
            Op::Authenticate,
            RequestKind::Unary,
            paths::AUTHENTICATE,
            body,
            now,
        );
        // Sent now, ahead of the queue it unblocks.
        self.out.unqueue(id);
        if let Some(a) = &mut self.auth {
            a.request = Some(id);
        }
        Some(id)
    }

    /// When the next authenticate request may go out, if requests wait for one.
    pub(super) fn auth_retry_at(&self) -> Option<u64> {
        let a = self.auth.as_ref()?;
        (a.token.is_empty() && a.request.is_none() && !self.out.queue_is_empty())
            .then_some(a.retry_at)
    }

    /// An error reply: if it refused the token (expired, or the member restarted), the next
    /// request gets a new one.
    pub(super) fn check_token(&mut self, e: &ReplyError) {
        if let Some(a) = &mut self.auth {
            if e.code() == Some(CODE_UNAUTHENTICATED) || e.to_string().contains("auth token") {
                a.token.clear();
            }
        }
    }

    /// The answer to an authenticate request: the token, or a refusal that fails everything
    /// that waited for it.
    pub(super) fn on_authenticate(
        &mut self,
        core: &mut Client,
        now: u64,
        reply: Result<Value, ReplyError>,
    ) {
        let token = self.read(reply, json::read_token);
        let refused = token.is_err();
        if let Some(a) = &mut self.auth {
            a.request = None;
            match token {
                Ok(t) => a.token = t,
                Err(_) => a.retry_at = now.saturating_add(REAUTH_AFTER_NS),
            }
        }
        if refused {
            // What waited for the token fails now (the engine retries within its
            // budget), rather than when the engine times it out.
            let why = self.out.last_error().to_owned();
            for id in self.out.drain_queue() {
                match self.out.get(id).map(|p| p.kind) {
                    Some(RequestKind::Unary) => {
                        if let Some(p) = self.out.take(id) {
                            self.on_reply(core, now, p.op, Err(ReplyError::Transport));
                        }
                    }
                    Some(_) => {
                        if let Some(p) = self.out.take(id) {
                            self.watch_ended(now, id, p.op);
                        }
                    }
                    None => {}
                }
            }
            self.out.set_last_error(why);
        }
    }
}
