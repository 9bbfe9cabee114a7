//! The flat forms that cross the seam: byte strings, the shared value format of every *call*
//! answer (Redis replies, SQL rows, memory answers) and SQL statements with typed parameters.
//!
//! No pointers inside the structs: strings are `offset`/`len` into one data buffer passed
//! beside the list, so cgo passes Go memory without pinning and ctypes and C++ fill them
//! without a copy per value.
#![allow(non_camel_case_types)]

use super::boundary::{Failure, optional_bytes_arg};
use super::types::*;
use crate::backend::{sql, value};

/// `lh_value.kind`: nil (null bulk string, null array, RESP3 null, SQL NULL).
pub const LH_VALUE_NIL: u32 = 1;
/// `lh_value.kind`: integer (`integer`).
pub const LH_VALUE_INT: u32 = 2;
/// `lh_value.kind`: bulk string or blob (`offset`, `len` into the data buffer).
pub const LH_VALUE_BULK: u32 = 3;
/// `lh_value.kind`: simple string such as `OK` (`offset`, `len`).
pub const LH_VALUE_STATUS: u32 = 4;
/// `lh_value.kind`: error reply, the message without `-` (`offset`, `len`).
pub const LH_VALUE_ERROR: u32 = 5;
/// `lh_value.kind`: array of `len` elements, which follow it in the list (pre-order).
pub const LH_VALUE_ARRAY: u32 = 6;
/// `lh_value.kind` of a column or parameter: UTF-8 text (`offset`, `len`).
pub const LH_VALUE_TEXT: u32 = 7;
/// `lh_value.kind` of a column: a double, its IEEE-754 bits in `integer`. (None of the
/// protocol's statements return one; a float where a number belongs is an error.)
pub const LH_VALUE_FLOAT: u32 = 8;
/// Parameter kind: bind the host's `CLOCK_MONOTONIC` in ns as an integer.
pub const LH_PARAM_HOST_MONOTONIC_NS: u32 = 20;
/// Parameter kind: bind the host's wall clock in µs since the Unix epoch as an integer.
pub const LH_PARAM_HOST_WALL_US: u32 = 21;
/// Parameter kind: bind the boot id (`/proc/sys/kernel/random/boot_id`, trimmed) as text.
pub const LH_PARAM_HOST_BOOT_ID: u32 = 22;
/// Parameter kind: bind the executing process's id as an integer.
pub const LH_PARAM_HOST_PID: u32 = 23;
/// Parameter kind: bind the host name as text.
pub const LH_PARAM_HOST_NAME: u32 = 24;

/// Most values in one answer (`lh_io_reply` refuses more with `LH_ERR_INVALID_REPLY`).
pub const LH_MAX_REPLY_VALUES: usize = 4096;
/// Largest data buffer of one answer, and longest channel, payload, message or body, in bytes.
pub const LH_MAX_REPLY_DATA: usize = 1 << 20;
/// Deepest array nesting accepted in an answer.
pub const LH_MAX_REPLY_DEPTH: usize = 16;

const _: () = {
    assert!(LH_VALUE_NIL == value::KIND_NIL);
    assert!(LH_VALUE_INT == value::KIND_INT);
    assert!(LH_VALUE_BULK == value::KIND_BULK);
    assert!(LH_VALUE_STATUS == value::KIND_STATUS);
    assert!(LH_VALUE_ERROR == value::KIND_ERROR);
    assert!(LH_VALUE_ARRAY == value::KIND_ARRAY);
    assert!(LH_VALUE_TEXT == sql::KIND_TEXT);
    assert!(LH_VALUE_FLOAT == sql::KIND_FLOAT);
    assert!(LH_PARAM_HOST_MONOTONIC_NS == sql::KIND_HOST_MONOTONIC_NS);
    assert!(LH_PARAM_HOST_WALL_US == sql::KIND_HOST_WALL_US);
    assert!(LH_PARAM_HOST_BOOT_ID == sql::KIND_HOST_BOOT_ID);
    assert!(LH_PARAM_HOST_PID == sql::KIND_HOST_PID);
    assert!(LH_PARAM_HOST_NAME == sql::KIND_HOST_NAME);
    assert!(LH_MAX_REPLY_VALUES == value::MAX_VALUES);
    assert!(LH_MAX_REPLY_DATA == value::MAX_DATA);
    assert!(LH_MAX_REPLY_DEPTH == value::MAX_DEPTH);
    assert!(LH_MAX_REPLY_VALUES == sql::MAX_VALUES);
    assert!(LH_MAX_REPLY_DATA == sql::MAX_DATA);
};

/// A borrowed byte string.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct lh_bytes {
    /// First byte (NULL only when `len` is 0).
    pub ptr: *const u8,
    /// Length in bytes.
    pub len: usize,
}

/// One value of a flat answer or parameter list. No pointers: strings are `offset`/`len`
/// into the data buffer passed beside the list.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct lh_value {
    /// `LH_VALUE_*` (or `LH_PARAM_HOST_*` for a parameter).
    pub kind: u32,
    /// Always 0.
    pub _reserved: u32,
    /// The integer of `LH_VALUE_INT` (the bits of `LH_VALUE_FLOAT`).
    pub integer: i64,
    /// Start of a string value in the data buffer.
    pub offset: u64,
    /// Byte length of a string value, or element count of an array.
    pub len: u64,
}

/// One statement of an SQL request: its SQL text and its parameters.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct lh_sql_statement {
    /// Start of the SQL text in the request's data buffer (a NUL follows it).
    pub sql_offset: u64,
    /// Length of the SQL text in bytes, without the NUL.
    pub sql_len: u64,
    /// Index of the statement's first parameter in the request's `params`.
    pub first_param: u32,
    /// Number of parameters (`?1…`/`$1…` in order).
    pub nparams: u32,
}

/// Reads a flat value list and its data buffer: NULL and the limits checked, then one copy
/// into the protocols' form.
///
/// # Safety
/// `values` points to `nvalues` readable `lh_value`s and `data` to `data_len` readable bytes
/// (NULL allowed when the count is 0).
pub(crate) unsafe fn flat_values_arg<'a>(
    values: *const lh_value,
    nvalues: usize,
    data: *const u8,
    data_len: usize,
) -> Result<(Vec<value::FlatValue>, &'a [u8]), Failure> {
    if values.is_null() {
        return Err(Failure::null("values"));
    }
    if nvalues > LH_MAX_REPLY_VALUES {
        return Err(Failure::new(
            LH_ERR_INVALID_REPLY,
            format!("the answer has {nvalues} values, the limit is {LH_MAX_REPLY_VALUES}"),
        ));
    }
    // SAFETY: non-NULL, count bounded, readable per the caller's contract.
    let values = unsafe { std::slice::from_raw_parts(values, nvalues) };
    // SAFETY: per the caller's contract.
    let data = unsafe {
        optional_bytes_arg(
            data,
            data_len,
            LH_MAX_REPLY_DATA,
            "data",
            LH_ERR_INVALID_REPLY,
        )
    }?;
    let flat = values
        .iter()
        .map(|v| value::FlatValue {
            kind: v.kind,
            integer: v.integer,
            offset: v.offset,
            len: v.len,
        })
        .collect();
    Ok((flat, data))
}
