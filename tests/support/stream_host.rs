//! A host that only moves bytes for a client of kind `LH_BACKEND_REDIS_STREAM`: it opens
//! the streams the core asks for (`TcpStream` / `UnixStream`), writes their bytes, passes
//! what it reads to `lh_io_received` and reports closes. It knows no Redis command.
#![allow(dead_code)]

use std::collections::HashMap;
use std::ffi::CStr;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use crate::abi::*;
use crate::support::resp::now;
use leasehold::ffi::*;

enum Sock {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Sock {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.read(buf),
            Sock::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Sock {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Sock::Tcp(s) => s.write(buf),
            Sock::Unix(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn c_text(p: *const std::ffi::c_char) -> Option<String> {
    // SAFETY: NULL or a NUL-terminated string borrowed from the handle until its next call.
    (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

/// A host that only moves bytes: one handle, its streams, the events it saw.
pub struct Host {
    pub h: H,
    socks: HashMap<u64, Sock>,
    pub events: Vec<lh_event>,
    pub opens: u64,
    /// Closes reported to the core (`lh_io_closed`).
    pub closes: u64,
    /// `LH_IO_SHUTDOWN`s the core asked for.
    pub shutdowns: u64,
    /// Where each stream was opened to (`host:port` or the socket path).
    pub opened_to: Vec<String>,
    /// Every byte written, by where its stream was opened to.
    pub written_to: HashMap<String, Vec<u8>>,
    dest: HashMap<u64, String>,
}

impl Host {
    pub fn new(url: &str, seed: u8, tweak: impl FnOnce(&mut lh_backend_options)) -> Host {
        let mut o = backend(LH_BACKEND_REDIS_STREAM);
        o.redis_url = url.as_ptr();
        o.redis_url_len = url.len();
        tweak(&mut o);
        let h = try_client(&config(), &o, &[seed; 32]).expect("lh_client_new");
        Host {
            h,
            socks: HashMap::new(),
            events: Vec::new(),
            opens: 0,
            closes: 0,
            shutdowns: 0,
            opened_to: Vec::new(),
            written_to: HashMap::new(),
            dest: HashMap::new(),
        }
    }

    /// Runs every request queued now.
    pub fn drain(&mut self) -> bool {
        let mut worked = false;
        loop {
            let mut r = std::mem::MaybeUninit::<lh_io_request>::uninit();
            // SAFETY: valid out-pointer, written on LH_OK.
            ok(unsafe { lh_io_poll(self.h.0, r.as_mut_ptr()) });
            // SAFETY: LH_OK wrote it; its pointers are used before the next call.
            let r = unsafe { r.assume_init() };
            match r.kind {
                LH_IO_NONE => break,
                LH_IO_OPEN => {
                    assert_eq!(r.id, r.stream);
                    self.opens += 1;
                    let sock = match (c_text(r.host), c_text(r.unix_path)) {
                        (Some(host), None) => {
                            self.opened_to.push(format!("{host}:{}", r.port));
                            self.dest.insert(r.stream, format!("{host}:{}", r.port));
                            assert_eq!(r.tls, 0);
                            TcpStream::connect((host.as_str(), r.port as u16)).map(|s| {
                                s.set_nodelay(true).unwrap();
                                s.set_nonblocking(true).unwrap();
                                Sock::Tcp(s)
                            })
                        }
                        (None, Some(path)) => UnixStream::connect({
                            self.opened_to.push(path.clone());
                            path
                        })
                        .map(|s| {
                            s.set_nonblocking(true).unwrap();
                            Sock::Unix(s)
                        }),
                        other => panic!("an OPEN names a host or a path: {other:?}"),
                    };
                    let t = now();
                    match sock {
                        Ok(s) => {
                            self.socks.insert(r.stream, s);
                            // SAFETY: live handle.
                            ok(unsafe { lh_io_opened(self.h.0, t, r.stream) });
                        }
                        Err(e) => self.closed(r.stream, &e.to_string()),
                    }
                }
                LH_IO_WRITE => {
                    // SAFETY: `data` is valid for `data_len` bytes until the next call.
                    let bytes = unsafe { std::slice::from_raw_parts(r.data, r.data_len) }.to_vec();
                    if let Some(d) = self.dest.get(&r.stream) {
                        self.written_to
                            .entry(d.clone())
                            .or_default()
                            .extend_from_slice(&bytes);
                    }
                    if let Err(e) = self.write(r.stream, &bytes) {
                        self.socks.remove(&r.stream);
                        self.closed(r.stream, &e.to_string());
                    }
                }
                LH_IO_SHUTDOWN => {
                    self.shutdowns += 1;
                    self.socks.remove(&r.stream);
                }
                other => panic!("a stream client asks only for streams, not kind {other}"),
            }
            worked = true;
        }
        worked
    }

    fn write(&mut self, stream: u64, mut bytes: &[u8]) -> std::io::Result<()> {
        let Some(sock) = self.socks.get_mut(&stream) else {
            return Err(std::io::Error::other("write on a stream that is not open"));
        };
        while !bytes.is_empty() {
            match sock.write(bytes) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => bytes = &bytes[n..],
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_micros(200))
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn closed(&mut self, stream: u64, why: &str) {
        self.closes += 1;
        // SAFETY: live handle; the message is read during the call.
        ok(unsafe { lh_io_closed(self.h.0, now(), stream, why.as_ptr(), why.len()) });
    }

    /// One turn of the loop: requests, reads, the deadline, events.
    pub fn step(&mut self) {
        let mut worked = self.drain();
        let mut buf = [0u8; 4096];
        let ids: Vec<u64> = self.socks.keys().copied().collect();
        for id in ids {
            while let Some(sock) = self.socks.get_mut(&id) {
                match sock.read(&mut buf) {
                    Ok(0) => {
                        self.socks.remove(&id);
                        self.closed(id, "end of stream");
                    }
                    Ok(n) => {
                        // SAFETY: live handle; `buf` is read during the call.
                        ok(unsafe { lh_io_received(self.h.0, now(), id, buf.as_ptr(), n) });
                        worked = true;
                        continue;
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                    Err(e) => {
                        self.socks.remove(&id);
                        self.closed(id, &e.to_string());
                    }
                }
                break;
            }
            worked |= self.drain();
        }
        let t = now();
        if self.h.deadline() <= t {
            ok(self.h.timeout(t));
            worked = true;
        }
        worked |= self.drain();
        self.events.extend(self.h.events());
        if !worked {
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    pub fn acquire(&mut self, name: &str, ttl_ms: u64, wait_ms: u64) -> u64 {
        let mut o = opts(ttl_ms);
        o.wait_ns = wait_ms * MS;
        let lease = self.h.acquire(now(), name.as_bytes(), &o).unwrap();
        self.drain();
        lease
    }

    pub fn release(&mut self, lease: u64) {
        ok(self.h.release(now(), lease));
        self.drain();
    }

    pub fn event(&self, lease: u64, kind: u32) -> Option<lh_event> {
        self.events
            .iter()
            .find(|e| e.lease_id == lease && e.kind == kind)
            .copied()
    }

    /// Steps until `lease` has an event of `kind` (or a terminal one), for at most `limit`.
    pub fn wait_for(&mut self, lease: u64, kind: u32, limit: Duration) -> Option<lh_event> {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            self.step();
            if let Some(e) = self.event(lease, kind) {
                return Some(e);
            }
        }
        None
    }

    pub fn step_for(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.step();
        }
    }
}
