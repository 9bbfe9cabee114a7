//! Redis URLs, parsed once in the core for the stream path: where to connect and what the
//! handshake sends. `redis://[user:pass@]host[:port][/db]`, `rediss://` (TLS, the server name
//! is the host) and `unix:///path[?db=N]`; Sentinel and Cluster URLs are refused with an
//! error that says so.

use crate::Error;

/// Where a connection goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A TCP host and port, with TLS when `tls` (verified against `server_name`).
    Tcp {
        /// Host name or address (IPv6 without brackets).
        host: String,
        /// Port.
        port: u16,
        /// Wrap the connection in TLS.
        tls: bool,
        /// The name the server's certificate is checked against (the host).
        server_name: String,
    },
    /// A Unix domain socket.
    Unix {
        /// The socket's path.
        path: String,
    },
}

/// A parsed URL: the endpoint and the handshake's credentials and database. Its `Debug`
/// form leaves the password out.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// Where to connect.
    pub endpoint: Endpoint,
    /// ACL user (`None`: the default user).
    pub username: Option<Vec<u8>>,
    /// Password (`None`: no `AUTH`).
    pub password: Option<Vec<u8>>,
    /// Database to `SELECT` (0: left as is).
    pub database: u32,
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisUrl")
            .field("endpoint", &self.endpoint)
            .field(
                "username",
                &self.username.as_deref().map(String::from_utf8_lossy),
            )
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("database", &self.database)
            .finish()
    }
}

const MAX_URL_LEN: usize = 4096;

/// Parses a Redis URL for the stream path (see the module docs).
pub fn parse_url(url: &str) -> Result<RedisUrl, Error> {
    if url.len() > MAX_URL_LEN {
        return Err(Error::InvalidConfig(
            "the Redis URL is longer than 4096 bytes",
        ));
    }
    let Some((scheme, rest)) = url.split_once("://") else {
        return Err(Error::InvalidConfig(
            "a Redis URL starts with redis://, rediss:// or unix://",
        ));
    };
    match scheme.to_ascii_lowercase().as_str() {
        "redis" => tcp(rest, false),
        "rediss" => tcp(rest, true),
        "unix" | "redis+unix" => unix(rest),
        "redis+sentinel" | "rediss+sentinel" | "sentinel" | "redis+cluster" | "rediss+cluster"
        | "cluster" => Err(Error::InvalidConfig(
            "Sentinel and Cluster URLs are not supported on the stream path yet",
        )),
        _ => Err(Error::InvalidConfig(
            "unsupported Redis URL scheme: use redis://, rediss:// or unix://",
        )),
    }
}

fn tcp(rest: &str, tls: bool) -> Result<RedisUrl, Error> {
    if rest.contains(['?', '#']) {
        return Err(Error::InvalidConfig(
            "a redis:// URL takes no query or fragment (the database is its path: /N)",
        ));
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let (userinfo, hostport) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let (username, password) = credentials(userinfo)?;
    let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
        let Some((host, after)) = v6.split_once(']') else {
            return Err(Error::InvalidConfig(
                "an IPv6 host in a Redis URL lacks its ]",
            ));
        };
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or(Error::InvalidConfig(
                "a Redis URL has garbage after its IPv6 host",
            ))?),
        };
        (host, port)
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c.is_control()) {
        return Err(Error::InvalidConfig("a Redis URL needs a host"));
    }
    let port = match port {
        None => 6379,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or(Error::InvalidConfig(
                "the port of a Redis URL must be in 1..=65535",
            ))?,
    };
    Ok(RedisUrl {
        endpoint: Endpoint::Tcp {
            host: host.to_owned(),
            port,
            tls,
            server_name: host.to_owned(),
        },
        username,
        password,
        database: database(path)?,
    })
}

fn unix(rest: &str) -> Result<RedisUrl, Error> {
    let (path, query) = match rest.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (rest, None),
    };
    if !path.starts_with('/') || path.len() < 2 {
        return Err(Error::InvalidConfig(
            "a unix:// URL needs an absolute socket path (unix:///path/to/redis.sock)",
        ));
    }
    let mut db = 0;
    for pair in query.into_iter().flat_map(|q| q.split('&')) {
        match pair.split_once('=') {
            Some(("db", n)) => db = database(n)?,
            _ => {
                return Err(Error::InvalidConfig(
                    "a unix:// URL takes only the query parameter db=N",
                ));
            }
        }
    }
    Ok(RedisUrl {
        endpoint: Endpoint::Unix {
            path: String::from_utf8(decode(path)?)
                .map_err(|_| Error::InvalidConfig("the socket path is not UTF-8"))?,
        },
        username: None,
        password: None,
        database: db,
    })
}

type Credentials = (Option<Vec<u8>>, Option<Vec<u8>>);

fn credentials(userinfo: Option<&str>) -> Result<Credentials, Error> {
    let Some(info) = userinfo else {
        return Ok((None, None));
    };
    let (user, pass) = match info.split_once(':') {
        Some((u, p)) => (u, Some(p)),
        // `redis://secret@host` is a password (as redis-py reads it), not a user.
        None => ("", Some(info)),
    };
    let user = (!user.is_empty()).then(|| decode(user)).transpose()?;
    let pass = pass.filter(|p| !p.is_empty()).map(decode).transpose()?;
    if user.is_some() && pass.is_none() {
        return Err(Error::InvalidConfig(
            "a Redis ACL user in a URL needs a password",
        ));
    }
    Ok((user, pass))
}

fn database(text: &str) -> Result<u32, Error> {
    if text.is_empty() {
        return Ok(0);
    }
    text.parse::<u32>()
        .ok()
        .filter(|&d| d <= 1_000_000)
        .ok_or(Error::InvalidConfig(
            "the database of a Redis URL must be a number (redis://host:port/N)",
        ))
}

/// Percent-decoding (`%40` → `@`), so a password may hold any byte.
fn decode(text: &str) -> Result<Vec<u8>, Error> {
    let bad = Error::InvalidConfig("a Redis URL has a malformed %-escape");
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3).ok_or(bad.clone())?;
            let hex = std::str::from_utf8(hex).map_err(|_| bad.clone())?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| bad.clone())?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp_of(u: &RedisUrl) -> (&str, u16, bool) {
        match &u.endpoint {
            Endpoint::Tcp {
                host,
                port,
                tls,
                server_name,
            } => {
                assert_eq!(host, server_name);
                (host, *port, *tls)
            }
            Endpoint::Unix { .. } => panic!("not TCP"),
        }
    }

    #[test]
    fn tcp_urls() {
        let u = parse_url("redis://localhost").unwrap();
        assert_eq!(tcp_of(&u), ("localhost", 6379, false));
        assert_eq!((u.username, u.password, u.database), (None, None, 0));
        let u = parse_url("rediss://alice:p%40ss@cache.example:6380/3").unwrap();
        assert_eq!(tcp_of(&u), ("cache.example", 6380, true));
        assert_eq!(u.username.as_deref(), Some(&b"alice"[..]));
        assert_eq!(u.password.as_deref(), Some(&b"p@ss"[..]));
        assert_eq!(u.database, 3);
        assert!(!format!("{u:?}").contains("p@ss"));
        let u = parse_url("redis://:secret@[::1]:7000/").unwrap();
        assert_eq!(tcp_of(&u), ("::1", 7000, false));
        assert_eq!(
            (u.username, u.password.as_deref()),
            (None, Some(&b"secret"[..]))
        );
        let u = parse_url("REDIS://secret@h").unwrap();
        assert_eq!(u.password.as_deref(), Some(&b"secret"[..]));
    }

    #[test]
    fn unix_urls() {
        let u = parse_url("unix:///run/redis.sock?db=2").unwrap();
        assert_eq!(
            u.endpoint,
            Endpoint::Unix {
                path: "/run/redis.sock".into()
            }
        );
        assert_eq!(u.database, 2);
        assert!(parse_url("unix://relative.sock").is_err());
        assert!(parse_url("unix:///a.sock?password=x").is_err());
    }

    #[test]
    fn refused() {
        for (url, words) in [
            (
                "redis+sentinel://h:26379/mymaster",
                "not supported on the stream path",
            ),
            ("redis+cluster://h:7000", "not supported on the stream path"),
            ("http://h", "unsupported Redis URL scheme"),
            ("localhost:6379", "starts with"),
            ("redis://h:0", "port"),
            ("redis://h:99999", "port"),
            ("redis://h:x", "port"),
            ("redis://:6379", "host"),
            ("redis://h/db", "database"),
            ("redis://h?db=1", "no query"),
            ("redis://user:@h", "needs a password"),
            ("redis://u:%zz@h", "%-escape"),
            ("redis://[::1", "]"),
        ] {
            match parse_url(url) {
                Err(Error::InvalidConfig(m)) => assert!(m.contains(words), "{url}: {m}"),
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}
