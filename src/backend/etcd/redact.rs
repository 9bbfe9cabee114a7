//! `Debug` for the etcd types that hold secrets: the password, the auth token and an
//! authenticate request's body (which carries the password) show as `<redacted>` (not even
//! their length), so a debug print or a log line never reveals them.

use std::fmt;

use super::{Auth, Pending, Request, paths};

/// A secret in `Debug`: `""` when empty (no secret set), else `<redacted>`.
struct Redacted(usize);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0 == 0 { "\"\"" } else { "<redacted>" })
    }
}

/// A request body in `Debug`: text, except an authenticate request's.
struct Body<'a> {
    path: &'a str,
    body: &'a [u8],
}

impl fmt::Debug for Body<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path == paths::AUTHENTICATE {
            Redacted(self.body.len()).fmt(f)
        } else {
            fmt::Debug::fmt(&String::from_utf8_lossy(self.body), f)
        }
    }
}

impl fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("id", &self.id)
            .field("kind", &self.kind)
            .field("method", &self.method)
            .field("path", &self.path)
            .field(
                "body",
                &Body {
                    path: self.path,
                    body: self.body,
                },
            )
            .field("authorization", &Redacted(self.authorization.len()))
            .finish()
    }
}

impl fmt::Debug for Pending {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pending")
            .field("op", &self.op)
            .field("kind", &self.kind)
            .field("path", &self.path)
            .field(
                "body",
                &Body {
                    path: self.path,
                    body: &self.body,
                },
            )
            .finish()
    }
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth")
            .field("user", &self.user)
            .field("password", &Redacted(self.password.len()))
            .field("token", &Redacted(self.token.len()))
            .field("request", &self.request)
            .field("retry_at", &self.retry_at)
            .finish()
    }
}
