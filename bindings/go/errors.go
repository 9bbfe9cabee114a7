package leasehold

import (
	"errors"
	"fmt"
)

var (
	// ErrNotAcquired: the lock was not acquired within the wait (it is held
	// by someone else, or the backend was unavailable for the whole wait).
	ErrNotAcquired = errors.New("leasehold: lock not acquired")
	// ErrUnavailable: the backend could not be reached for the whole wait.
	// Errors that match it also match ErrNotAcquired.
	ErrUnavailable = errors.New("leasehold: backend unavailable")
	// ErrClosed: the LockClient was closed.
	ErrClosed = errors.New("leasehold: client closed")
	// ErrInvalidArgument: a bad name, TTL, wait or option.
	ErrInvalidArgument = errors.New("leasehold: invalid argument")
	// ErrLost is the cause of a lease context cancelled because the lease
	// was lost (rejected by the backend, expired, or renewals failed).
	ErrLost = errors.New("leasehold: lease lost")
	// ErrReleased is the cause of a lease context cancelled by Release,
	// and the error of Renew on a released lease.
	ErrReleased = errors.New("leasehold: lease released")
	// ErrNotOwner: the service refused a release because the grant was no
	// longer ours (it expired, and someone else may hold the lock now).
	ErrNotOwner = errors.New("leasehold: release refused: not the owner")
	// ErrStaleToken: the fencing gate refused a token lower than the
	// resource's high-water mark.
	ErrStaleToken = errors.New("leasehold: stale fencing token")
	// ErrBroken: the core handle panicked and is poisoned.
	ErrBroken = errors.New("leasehold: core handle poisoned")
)

// StatusError wraps a status returned by the C library with its detail.
type StatusError struct {
	Status uint32 // lh_status value
	Name   string // e.g. "LH_ERR_EMPTY_NAME"
	Op     string // C function that returned it
	Detail string // lh_client_last_error, may be empty
}

func (e *StatusError) Error() string {
	if e.Detail != "" {
		return fmt.Sprintf("leasehold: %s: %s (%d): %s", e.Op, e.Name, e.Status, e.Detail)
	}
	return fmt.Sprintf("leasehold: %s: %s (%d)", e.Op, e.Name, e.Status)
}

// Is makes argument errors match ErrInvalidArgument and a poisoned handle
// match ErrBroken.
func (e *StatusError) Is(target error) bool {
	switch target {
	case ErrInvalidArgument:
		switch e.Status {
		case statusNullArgument, statusInvalidUTF8, statusEmptyName, statusNameTooLong,
			statusNameHasNul, statusInvalidTTL, statusInvalidConfig, statusSeedTooShort,
			statusInvalidEnum, statusBackendDataTooLong, statusStructSize:
			return true
		}
	case ErrBroken:
		return e.Status == statusPanic || e.Status == statusPoisoned
	}
	return false
}

// AcquireError reports why an Acquire did not succeed. It matches
// ErrNotAcquired, and ErrUnavailable when the backend was unreachable.
type AcquireError struct {
	Name   string
	Reason string // "wait exhausted", "unavailable", "cancelled"
	// Detail is, when the backend was unavailable, the last error its
	// protocol saw (LockClient.BackendError): a refused password, an
	// unreachable server, a foreign table, an error reply.
	Detail string
	code   uint32
}

func (e *AcquireError) Error() string {
	if e.Detail != "" {
		return fmt.Sprintf("leasehold: lock %q not acquired: %s: %s", e.Name, e.Reason, e.Detail)
	}
	return fmt.Sprintf("leasehold: lock %q not acquired: %s", e.Name, e.Reason)
}

func (e *AcquireError) Is(target error) bool {
	switch target {
	case ErrNotAcquired:
		return true
	case ErrUnavailable:
		return e.code == reasonUnavailable
	}
	return false
}

// LostError is the cause of a lease context cancelled by loss, and the
// error of Release and Renew on a lost lease.
type LostError struct {
	Name   string
	Reason string // "rejected", "expired", "fail budget"
}

func (e *LostError) Error() string {
	return fmt.Sprintf("leasehold: lease on %q lost: %s", e.Name, e.Reason)
}

func (e *LostError) Is(target error) bool { return target == ErrLost }

func reasonString(r uint32) string {
	switch r {
	case reasonWaitExhausted:
		return "wait exhausted"
	case reasonCancelled:
		return "cancelled"
	case reasonUnavailable:
		return "backend unavailable"
	case reasonRejected:
		return "rejected by the backend"
	case reasonExpired:
		return "expired"
	case reasonFailBudget:
		return "renewal failures exhausted the budget"
	}
	return fmt.Sprintf("reason %d", r)
}

func invalidArg(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, a...)...)
}

// isStatus reports whether err is a StatusError with status st.
func isStatus(err error, st uint32) bool {
	var se *StatusError
	return errors.As(err, &se) && se.Status == st
}
