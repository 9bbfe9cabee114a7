//! The fencing gate at the protected resource.
//!
//! docs/design.md §7: the resource, not the lock client, enforces exclusivity. It keeps
//! a high-water mark per resource and accepts a write only if the write's
//! fencing token is at least the mark (equal tokens pass so that a holder's
//! retries are accepted). Invariant I6 says this gate never accepts a token
//! lower than one it already accepted, whatever the clocks and pauses do.

use std::collections::HashMap;

/// How the gate decides. `Broken` exists only so the test suite can prove
/// that the I6 oracle really fails when a gate misbehaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateMode {
    /// Reject `token < high-water mark` (the correct gate).
    Correct,
    /// Accept everything (a resource without fencing): a test-only mutant.
    Broken,
}

/// One gate guarding one resource per lock name.
#[derive(Debug)]
pub struct FencingGate {
    mode: GateMode,
    hwm: HashMap<String, u64>,
    accepted: u64,
    rejected: u64,
}

impl FencingGate {
    /// An empty gate.
    pub fn new(mode: GateMode) -> Self {
        FencingGate {
            mode,
            hwm: HashMap::new(),
            accepted: 0,
            rejected: 0,
        }
    }

    /// Attempts a write to resource `name` carrying `token`; true if accepted.
    pub fn write(&mut self, name: &str, token: u64) -> bool {
        let mark = self.hwm.get(name).copied().unwrap_or(0);
        let ok = match self.mode {
            GateMode::Correct => token >= mark,
            GateMode::Broken => true,
        };
        if ok {
            if token > mark {
                self.hwm.insert(name.to_owned(), token);
            }
            self.accepted += 1;
        } else {
            self.rejected += 1;
        }
        ok
    }

    /// Writes accepted so far.
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// Writes rejected so far (stale holders caught by fencing).
    pub fn rejected(&self) -> u64 {
        self.rejected
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn correct_gate_rejects_only_lower_tokens() {
        let mut g = FencingGate::new(GateMode::Correct);
        assert!(g.write("a", 5));
        assert!(g.write("a", 5));
        assert!(!g.write("a", 4));
        assert!(g.write("b", 1));
        assert!(g.write("a", 9));
        assert!(!g.write("a", 5));
        assert_eq!((g.accepted(), g.rejected()), (4, 2));
    }

    #[test]
    fn broken_gate_accepts_stale_tokens() {
        let mut g = FencingGate::new(GateMode::Broken);
        assert!(g.write("a", 5));
        assert!(g.write("a", 4));
    }
}
