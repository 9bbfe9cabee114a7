//! Panic boundary, poisoning, per-handle detail messages and checked pointer conversion.
//!
//! Unwinding out of an `extern "C"` function aborts the host process, and a panic half-way
//! through a core mutation may leave the client in a state no invariant covers. So every
//! export runs its body through one of the `guard*` functions here: a panic becomes
//! `LH_ERR_PANIC`, the handle is poisoned, and every later call on it returns
//! `LH_ERR_POISONED` without touching the core again.
//!
//! The detail message of the last error lives in the handle, never in thread-local storage:
//! a goroutine may move to another OS thread between two cgo calls.

use std::any::Any;
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::ffi::CString;
use std::panic::{AssertUnwindSafe, catch_unwind};

use super::client::{ClientState, lh_client};
use super::types::*;
use crate::Error;

/// An error to report through the ABI: a status code and a human-readable detail.
#[derive(Debug)]
pub(crate) struct Failure {
    pub(crate) status: lh_status,
    pub(crate) detail: Cow<'static, str>,
}

impl Failure {
    pub(crate) fn new(status: lh_status, detail: impl Into<Cow<'static, str>>) -> Self {
        Failure {
            status,
            detail: detail.into(),
        }
    }

    /// A required pointer argument was NULL.
    pub(crate) fn null(what: &'static str) -> Self {
        Failure::new(LH_ERR_NULL_ARGUMENT, format!("{what} is NULL"))
    }

    /// A `struct_size` field was smaller than the library's struct.
    pub(crate) fn struct_size(what: &'static str, got: u32, need: usize) -> Self {
        Failure::new(
            LH_ERR_STRUCT_SIZE,
            format!("{what}.struct_size is {got}, this library needs at least {need}"),
        )
    }

    /// An enum value or flag passed in is unknown.
    pub(crate) fn invalid_enum(what: &'static str, got: u32) -> Self {
        Failure::new(LH_ERR_INVALID_ENUM, format!("unknown {what} value {got}"))
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Self {
        let status = match &e {
            Error::EmptyName => LH_ERR_EMPTY_NAME,
            Error::NameTooLong { .. } => LH_ERR_NAME_TOO_LONG,
            Error::NameHasNul => LH_ERR_NAME_HAS_NUL,
            Error::InvalidTtl { .. } => LH_ERR_INVALID_TTL,
            Error::InvalidConfig(_) => LH_ERR_INVALID_CONFIG,
            Error::SeedTooShort { .. } => LH_ERR_SEED_TOO_SHORT,
            Error::UnknownLease(_) => LH_ERR_UNKNOWN_LEASE,
            Error::LeaseEnded(_) => LH_ERR_LEASE_ENDED,
            Error::NotGranted(_) => LH_ERR_NOT_GRANTED,
            Error::TooManyLeases => LH_ERR_TOO_MANY_LEASES,
            Error::BackendDataTooLong { .. } => LH_ERR_BACKEND_DATA_TOO_LONG,
        };
        Failure::new(status, e.to_string())
    }
}

/// Per-handle diagnostics. Interior mutability because getters take `const lh_client *` and
/// must still be able to record an error or a poisoning panic; the handle is not `Sync`
/// (callers serialize), so `Cell`/`RefCell` suffice.
#[derive(Debug)]
pub(crate) struct Diag {
    poisoned: Cell<bool>,
    message: RefCell<CString>,
}

impl Diag {
    pub(crate) fn new() -> Self {
        Diag {
            poisoned: Cell::new(false),
            message: RefCell::new(CString::default()),
        }
    }

    fn set_message(&self, text: &str) {
        // A detail never contains NUL in practice; escape it rather than fail.
        let clean = if text.contains('\0') {
            text.replace('\0', "\\0")
        } else {
            text.to_owned()
        };
        if let (Ok(c), Ok(mut slot)) = (CString::new(clean), self.message.try_borrow_mut()) {
            *slot = c;
        }
    }

    /// Pointer to the NUL-terminated detail; valid until the message is next replaced.
    pub(crate) fn message_ptr(&self) -> *const std::ffi::c_char {
        match self.message.try_borrow() {
            Ok(m) => m.as_ptr(),
            Err(_) => c"".as_ptr(),
        }
    }

    /// Turns the outcome of a guarded body into a status. The success path is inlined into
    /// every export; the error paths are cold so they cost nothing on the hot path.
    #[inline]
    fn finish(&self, outcome: std::thread::Result<Result<(), Failure>>) -> lh_status {
        match outcome {
            Ok(Ok(())) => LH_OK,
            Ok(Err(f)) => self.fail(f),
            Err(payload) => self.panicked(payload),
        }
    }

    #[cold]
    #[inline(never)]
    fn fail(&self, f: Failure) -> lh_status {
        self.set_message(&f.detail);
        f.status
    }

    #[cold]
    #[inline(never)]
    fn panicked(&self, payload: Box<dyn Any + Send>) -> lh_status {
        self.poisoned.set(true);
        self.set_message(&format!(
            "panic inside leasehold (handle poisoned): {}",
            panic_text(payload.as_ref())
        ));
        LH_ERR_PANIC
    }

    #[inline]
    fn check_poisoned(&self) -> Result<(), lh_status> {
        if self.poisoned.get() {
            Err(self.report_poisoned())
        } else {
            Ok(())
        }
    }

    #[cold]
    #[inline(never)]
    fn report_poisoned(&self) -> lh_status {
        self.set_message("handle poisoned by an earlier panic; free it and create a new one");
        LH_ERR_POISONED
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "non-string panic payload"
    }
}

/// Runs `f` on a handle with exclusive access (a `lh_client *` receiver).
///
/// # Safety
/// `c` is NULL or a live pointer from `lh_client_new` not used concurrently by another thread.
#[inline]
pub(crate) unsafe fn guard_mut(
    c: *mut lh_client,
    f: impl FnOnce(&mut ClientState) -> Result<(), Failure>,
) -> lh_status {
    // SAFETY: the caller guarantees `c` is NULL or a live, unaliased handle.
    let Some(h) = (unsafe { c.as_mut() }) else {
        return LH_ERR_NULL_ARGUMENT;
    };
    if let Err(s) = h.diag.check_poisoned() {
        return s;
    }
    let state = &mut h.state;
    let outcome = catch_unwind(AssertUnwindSafe(|| f(state)));
    h.diag.finish(outcome)
}

/// Runs `f` on a handle with shared access (a `const lh_client *` receiver).
///
/// # Safety
/// `c` is NULL or a live pointer from `lh_client_new` not used concurrently by another thread.
#[inline]
pub(crate) unsafe fn guard_ref(
    c: *const lh_client,
    f: impl FnOnce(&ClientState) -> Result<(), Failure>,
) -> lh_status {
    // SAFETY: the caller guarantees `c` is NULL or a live handle.
    let Some(h) = (unsafe { c.as_ref() }) else {
        return LH_ERR_NULL_ARGUMENT;
    };
    if let Err(s) = h.diag.check_poisoned() {
        return s;
    }
    let state = &h.state;
    let outcome = catch_unwind(AssertUnwindSafe(|| f(state)));
    h.diag.finish(outcome)
}

/// Runs `f` on the state of a handle of another kind (`lh_memory_service`, …) inside the
/// same poisoning and panic boundary as [`guard_mut`]; the caller has turned its handle
/// pointer into the handle's `diag` and `state`.
#[inline]
pub(crate) fn guard_parts<S>(
    diag: &Diag,
    state: S,
    f: impl FnOnce(S) -> Result<(), Failure>,
) -> lh_status {
    if let Err(s) = diag.check_poisoned() {
        return s;
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| f(state)));
    diag.finish(outcome)
}

/// Runs a handle-less body (constructors, static tables): a panic becomes `LH_ERR_PANIC`.
pub(crate) fn guard_static(f: impl FnOnce() -> Result<(), Failure>) -> lh_status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => LH_OK,
        Ok(Err(e)) => e.status,
        Err(_) => LH_ERR_PANIC,
    }
}

/// Converts a required pointer + length into a byte slice, bounding the length first so that
/// a garbage length is an error rather than an out-of-bounds read.
///
/// # Safety
/// If non-NULL and `len <= max`, `ptr` must point to `len` readable bytes that stay unchanged
/// for the duration of the call.
pub(crate) unsafe fn bytes_arg<'a>(
    ptr: *const u8,
    len: usize,
    max: usize,
    what: &'static str,
    too_long: lh_status,
) -> Result<&'a [u8], Failure> {
    if ptr.is_null() {
        return Err(Failure::null(what));
    }
    if len > max {
        return Err(Failure::new(
            too_long,
            format!("{what} is {len} bytes, the limit is {max}"),
        ));
    }
    // SAFETY: non-NULL, length bounded (so <= isize::MAX), readable per the caller's contract.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// Like [`bytes_arg`] but NULL is accepted when `len == 0` (an absent optional buffer).
///
/// # Safety
/// As for [`bytes_arg`].
pub(crate) unsafe fn optional_bytes_arg<'a>(
    ptr: *const u8,
    len: usize,
    max: usize,
    what: &'static str,
    too_long: lh_status,
) -> Result<&'a [u8], Failure> {
    if ptr.is_null() && len == 0 {
        return Ok(&[]);
    }
    // SAFETY: forwarded contract.
    unsafe { bytes_arg(ptr, len, max, what, too_long) }
}

/// Converts a name argument: non-NULL, at most `LH_MAX_NAME_LEN` bytes, valid UTF-8.
/// Emptiness and embedded NULs are left to the core so that its errors stay the single source.
///
/// # Safety
/// As for [`bytes_arg`].
pub(crate) unsafe fn name_arg<'a>(ptr: *const u8, len: usize) -> Result<&'a str, Failure> {
    // SAFETY: forwarded contract.
    let bytes = unsafe { bytes_arg(ptr, len, LH_MAX_NAME_LEN, "name", LH_ERR_NAME_TOO_LONG)? };
    std::str::from_utf8(bytes)
        .map_err(|e| Failure::new(LH_ERR_INVALID_UTF8, format!("name is not valid UTF-8: {e}")))
}

/// A borrowed buffer for the host: NULL when empty. An empty slice's pointer is a dangling
/// non-NULL value (0x1, 0x8…) that a garbage-collected host such as Go rejects when it meets
/// it on a stack.
pub(crate) fn out_ptr<T>(s: &[T]) -> *const T {
    if s.is_empty() {
        std::ptr::null()
    } else {
        s.as_ptr()
    }
}

/// Writes `value` through an out-pointer that was checked non-NULL.
///
/// # Safety
/// `out` must be valid for a write of `T` and properly aligned.
pub(crate) unsafe fn write_out<T>(out: *mut T, value: T) {
    // SAFETY: per the caller's contract.
    unsafe { out.write(value) }
}

/// Checks an out-pointer for NULL before any state changes, so that "out-params are written
/// only on success" and "errors leave state unchanged" hold together.
pub(crate) fn require_out<T>(out: *mut T, what: &'static str) -> Result<(), Failure> {
    if out.is_null() {
        Err(Failure::null(what))
    } else {
        Ok(())
    }
}

/// Reads the leading `uint32_t struct_size` of a caller struct and, if it is large enough,
/// the whole struct.
///
/// # Safety
/// `ptr` is NULL or points to a readable, aligned `T` whose first field is a `u32` size.
pub(crate) unsafe fn read_sized<T: Copy>(ptr: *const T, what: &'static str) -> Result<T, Failure> {
    if ptr.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: every sized struct of this ABI starts with `uint32_t struct_size`.
    let size = unsafe { ptr.cast::<u32>().read() };
    if (size as usize) < std::mem::size_of::<T>() {
        return Err(Failure::struct_size(what, size, std::mem::size_of::<T>()));
    }
    // SAFETY: the caller claims (via struct_size) at least size_of::<T>() readable bytes.
    Ok(unsafe { ptr.read() })
}

/// Like [`read_sized`] for an out-struct: checks NULL and `struct_size` before any work.
///
/// # Safety
/// As for [`read_sized`].
pub(crate) unsafe fn check_sized_out<T>(ptr: *mut T, what: &'static str) -> Result<(), Failure> {
    if ptr.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: every sized struct of this ABI starts with `uint32_t struct_size`.
    let size = unsafe { ptr.cast::<u32>().read() };
    if (size as usize) < std::mem::size_of::<T>() {
        return Err(Failure::struct_size(what, size, std::mem::size_of::<T>()));
    }
    Ok(())
}

/// Like [`check_sized_out`] for an out-struct that grows at the end: accepts any
/// `struct_size` of at least `min` bytes and returns how many bytes to write (the caller's
/// size, capped at this library's), so a host built against an older header keeps working.
///
/// # Safety
/// As for [`read_sized`].
pub(crate) unsafe fn check_growing_out<T>(
    ptr: *mut T,
    what: &'static str,
    min: usize,
) -> Result<usize, Failure> {
    if ptr.is_null() {
        return Err(Failure::null(what));
    }
    // SAFETY: every sized struct of this ABI starts with `uint32_t struct_size`.
    let size = unsafe { ptr.cast::<u32>().read() } as usize;
    if size < min {
        return Err(Failure::struct_size(what, size as u32, min));
    }
    Ok(size.min(std::mem::size_of::<T>()))
}

/// Writes the first `len` bytes of `value` (whose leading `uint32_t struct_size` is set to
/// `len`, so the caller's struct never claims more than it has).
///
/// # Safety
/// `out` is valid for writing `len` bytes, `4 <= len <= size_of::<T>()`, and `T` is a
/// `#[repr(C)]` plain-data struct starting with a `u32`.
pub(crate) unsafe fn write_prefix<T: Copy>(out: *mut T, value: T, len: usize) {
    let mut value = value;
    // SAFETY: `T` starts with its `u32` struct size (caller's contract).
    unsafe { (&raw mut value).cast::<u32>().write(len as u32) };
    // SAFETY: `len` bytes are readable from `value` and writable at `out`; no overlap.
    unsafe {
        std::ptr::copy_nonoverlapping((&raw const value).cast::<u8>(), out.cast::<u8>(), len)
    };
}
