//! Redis URLs, parsed once in the core for the stream path: where to connect and what the
//! handshake sends. `redis://[user:pass@]host[:port][/db]`, `rediss://` (TLS, the server name
//! is the host), `unix:///path[?db=N]` and
//! `redis+sentinel://[[user]:pass@]host:port[,host:port…]/MASTER[/db]` (the bindings' form: the
//! credentials and database are the Redis servers', the sentinels take none) and
//! `redis+cluster://[[user]:pass@]host:port[,host:port…][/]` / `rediss+cluster://` (seed nodes of
//! a Redis Cluster; database 0 only, as a cluster has no other).

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

/// A `redis+sentinel://` URL: the sentinels to ask, the master's name, and what the
/// handshake with the master sends. Its `Debug` form leaves the password out.
#[derive(Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    /// The sentinels, asked in this order (plain TCP).
    pub sentinels: Vec<Endpoint>,
    /// The name the sentinels monitor the master under.
    pub master_name: String,
    /// ACL user of the Redis servers (`None`: the default user).
    pub username: Option<Vec<u8>>,
    /// Password of the Redis servers (`None`: no `AUTH`).
    pub password: Option<Vec<u8>>,
    /// Database to `SELECT` on the master (0: left as is).
    pub database: u32,
}

impl std::fmt::Debug for SentinelUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelUrl")
            .field("sentinels", &self.sentinels)
            .field("master_name", &self.master_name)
            .field(
                "username",
                &self.username.as_deref().map(String::from_utf8_lossy),
            )
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("database", &self.database)
            .finish()
    }
}

/// A `redis+cluster://` URL: the seed nodes the topology is first asked of, and what every
/// node's handshake sends. Its `Debug` form leaves the password out.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterUrl {
    /// Seed nodes, asked in this order (TLS for `rediss+cluster://`).
    pub seeds: Vec<Endpoint>,
    /// Every node is reached over TLS (its certificate checked against its host).
    pub tls: bool,
    /// ACL user (`None`: the default user).
    pub username: Option<Vec<u8>>,
    /// Password (`None`: no `AUTH`).
    pub password: Option<Vec<u8>>,
}

impl std::fmt::Debug for ClusterUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterUrl")
            .field("seeds", &self.seeds)
            .field("tls", &self.tls)
            .field(
                "username",
                &self.username.as_deref().map(String::from_utf8_lossy),
            )
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// What a stream-path URL names: one server, a master found through sentinels, or a
/// cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `redis://`, `rediss://`, `unix://`.
    Direct(RedisUrl),
    /// `redis+sentinel://`.
    Sentinel(SentinelUrl),
    /// `redis+cluster://`, `rediss+cluster://`.
    Cluster(ClusterUrl),
}

const MAX_URL_LEN: usize = 4096;
/// Most sentinels one URL may name.
const MAX_SENTINELS: usize = 64;

/// Parses any URL of the stream path: one server, a Sentinel deployment or a cluster.
pub fn parse_target(url: &str) -> Result<Target, Error> {
    if url.len() <= MAX_URL_LEN {
        if let Some((scheme, rest)) = url.split_once("://") {
            if scheme.eq_ignore_ascii_case("redis+sentinel") {
                return sentinel(rest).map(Target::Sentinel);
            }
            if scheme.eq_ignore_ascii_case("redis+cluster") {
                return cluster(rest, false).map(Target::Cluster);
            }
            if scheme.eq_ignore_ascii_case("rediss+cluster") {
                return cluster(rest, true).map(Target::Cluster);
            }
        }
    }
    parse_url(url).map(Target::Direct)
}

/// Whether `url` is a Cluster URL by its scheme (it may still be malformed): a cluster needs
/// sharded wake-ups, chosen before the URL is parsed.
pub fn is_cluster_url(url: &str) -> bool {
    url.split_once("://").is_some_and(|(scheme, _)| {
        scheme.eq_ignore_ascii_case("redis+cluster")
            || scheme.eq_ignore_ascii_case("rediss+cluster")
    })
}

/// Parses a URL of one server (see the module docs); a Sentinel URL is
/// [`parse_target`]'s.
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
        "redis+sentinel" => Err(Error::InvalidConfig(
            "a redis+sentinel:// URL names sentinels, not one server",
        )),
        "rediss+sentinel" | "sentinel" => Err(Error::InvalidConfig(
            "a Sentinel URL on the stream path is redis+sentinel://HOST:PORT[,HOST:PORT]/MASTER[/DB] (no TLS)",
        )),
        "redis+cluster" | "rediss+cluster" => Err(Error::InvalidConfig(
            "a redis+cluster:// URL names seed nodes of a cluster, not one server",
        )),
        "cluster" => Err(Error::InvalidConfig(
            "a Cluster URL is redis+cluster://HOST:PORT[,HOST:PORT] or rediss+cluster://…",
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
    let (host, port) = host_port(hostport, 6379)?;
    Ok(RedisUrl {
        endpoint: Endpoint::Tcp {
            server_name: host.clone(),
            host,
            port,
            tls,
        },
        username,
        password,
        database: database(path)?,
    })
}

/// `host[:port]` or `[v6][:port]`.
fn host_port(hostport: &str, default_port: u16) -> Result<(String, u16), Error> {
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
        None => default_port,
        Some(p) => p
            .parse::<u16>()
            .ok()
            .filter(|&p| p != 0)
            .ok_or(Error::InvalidConfig(
                "the port of a Redis URL must be in 1..=65535",
            ))?,
    };
    Ok((host.to_owned(), port))
}

fn sentinel(rest: &str) -> Result<SentinelUrl, Error> {
    if rest.contains(['?', '#']) {
        return Err(Error::InvalidConfig(
            "a redis+sentinel:// URL takes no query or fragment (timeouts are backend options)",
        ));
    }
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let (username, password) = credentials(userinfo)?;
    let mut sentinels = Vec::new();
    for item in hosts.split(',') {
        if sentinels.len() == MAX_SENTINELS {
            return Err(Error::InvalidConfig(
                "a redis+sentinel:// URL names at most 64 sentinels",
            ));
        }
        let (host, port) = host_port(item, 26379)?;
        sentinels.push(Endpoint::Tcp {
            server_name: host.clone(),
            host,
            port,
            tls: false,
        });
    }
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (name, db) = match parts[..] {
        [name] => (name, ""),
        [name, db] => (name, db),
        _ => {
            return Err(Error::InvalidConfig(
                "a redis+sentinel:// URL needs /MASTER_NAME[/DB] after the sentinels",
            ));
        }
    };
    let master_name = String::from_utf8(decode(name)?)
        .ok()
        .filter(|n| !n.contains(|c: char| c.is_whitespace() || c.is_control()))
        .ok_or(Error::InvalidConfig(
            "the master name of a redis+sentinel:// URL must be UTF-8 without spaces",
        ))?;
    Ok(SentinelUrl {
        sentinels,
        master_name,
        username,
        password,
        database: database(db)?,
    })
}

fn cluster(rest: &str, tls: bool) -> Result<ClusterUrl, Error> {
    if rest.contains(['?', '#']) {
        return Err(Error::InvalidConfig(
            "a redis+cluster:// URL takes no query or fragment (timeouts are backend options)",
        ));
    }
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if !matches!(path, "" | "0") {
        return Err(Error::InvalidConfig(
            "a redis+cluster:// URL takes no database: a cluster has only database 0",
        ));
    }
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let (username, password) = credentials(userinfo)?;
    let mut seeds = Vec::new();
    for item in hosts.split(',') {
        if seeds.len() == MAX_SENTINELS {
            return Err(Error::InvalidConfig(
                "a redis+cluster:// URL names at most 64 seed nodes",
            ));
        }
        let (host, port) = host_port(item, 6379)?;
        seeds.push(Endpoint::Tcp {
            server_name: host.clone(),
            host,
            port,
            tls,
        });
    }
    Ok(ClusterUrl {
        seeds,
        tls,
        username,
        password,
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
            ("redis+sentinel://h:26379/mymaster", "names sentinels"),
            ("rediss+sentinel://h:26379/mymaster", "no TLS"),
            ("redis+cluster://h:7000", "names seed nodes"),
            ("cluster://h:7000", "redis+cluster://HOST:PORT"),
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

    #[test]
    fn sentinel_urls() {
        let Ok(Target::Sentinel(u)) =
            parse_target("redis+sentinel://:p%40ss@10.0.0.1:26380,[::1],h/my%2Dmaster/2")
        else {
            panic!("not a Sentinel URL")
        };
        let tcp = |host: &str, port| Endpoint::Tcp {
            host: host.into(),
            port,
            tls: false,
            server_name: host.into(),
        };
        assert_eq!(
            u.sentinels,
            vec![tcp("10.0.0.1", 26380), tcp("::1", 26379), tcp("h", 26379)]
        );
        assert_eq!(u.master_name, "my-master");
        assert_eq!(
            (&u.username, u.password.as_deref()),
            (&None, Some(&b"p@ss"[..]))
        );
        assert_eq!(u.database, 2);
        assert!(!format!("{u:?}").contains("p@ss"));
        let Ok(Target::Sentinel(u)) = parse_target("REDIS+SENTINEL://app:pw@h:1/m") else {
            panic!("not a Sentinel URL")
        };
        assert_eq!((u.username.as_deref(), u.database), (Some(&b"app"[..]), 0));
        assert!(matches!(
            parse_target("redis://h:1/3"),
            Ok(Target::Direct(RedisUrl { database: 3, .. }))
        ));
        let many = format!("redis+sentinel://{}h:1/m", "h:1,".repeat(64));
        for (url, words) in [
            ("redis+sentinel://h:26379", "MASTER_NAME"),
            ("redis+sentinel://h:26379/", "MASTER_NAME"),
            ("redis+sentinel://h:26379/m/1/2", "MASTER_NAME"),
            ("redis+sentinel://h:26379/m/x", "database"),
            ("redis+sentinel://h:x/m", "port"),
            ("redis+sentinel://h:1,,h:2/m", "host"),
            ("redis+sentinel:///m", "host"),
            ("redis+sentinel://h/m?sentinel_password=x", "no query"),
            ("redis+sentinel://h/m%20x", "without spaces"),
            ("redis+sentinel://h/%zz", "%-escape"),
            ("redis+sentinel://u:@h/m", "needs a password"),
            (many.as_str(), "at most 64"),
        ] {
            match parse_target(url) {
                Err(Error::InvalidConfig(m)) => assert!(m.contains(words), "{url}: {m}"),
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn cluster_urls() {
        let Ok(Target::Cluster(u)) =
            parse_target("redis+cluster://app:p%40ss@10.0.0.1:7000,[::1]:7001,h")
        else {
            panic!("not a Cluster URL")
        };
        let tcp = |host: &str, port, tls| Endpoint::Tcp {
            host: host.into(),
            port,
            tls,
            server_name: host.into(),
        };
        assert_eq!(
            u.seeds,
            vec![
                tcp("10.0.0.1", 7000, false),
                tcp("::1", 7001, false),
                tcp("h", 6379, false)
            ]
        );
        assert_eq!(u.username.as_deref(), Some(&b"app"[..]));
        assert_eq!(u.password.as_deref(), Some(&b"p@ss"[..]));
        assert!(!u.tls);
        assert!(!format!("{u:?}").contains("p@ss"));
        let Ok(Target::Cluster(u)) = parse_target("REDISS+CLUSTER://h:7000/0") else {
            panic!("not a Cluster URL")
        };
        assert_eq!((u.seeds, u.tls), (vec![tcp("h", 7000, true)], true));
        assert!(is_cluster_url("rediss+cluster://h") && !is_cluster_url("redis://h"));
        let many = format!("redis+cluster://{}h:1", "h:1,".repeat(64));
        for (url, words) in [
            ("redis+cluster://h:7000/3", "only database 0"),
            ("redis+cluster://h:7000/x", "only database 0"),
            ("redis+cluster://h:x", "port"),
            ("redis+cluster://h:1,,h:2", "host"),
            ("redis+cluster://", "host"),
            ("redis+cluster://h?x=1", "no query"),
            ("redis+cluster://u:@h", "needs a password"),
            (many.as_str(), "at most 64"),
        ] {
            match parse_target(url) {
                Err(Error::InvalidConfig(m)) => assert!(m.contains(words), "{url}: {m}"),
                other => panic!("{url}: {other:?}"),
            }
        }
    }
}
