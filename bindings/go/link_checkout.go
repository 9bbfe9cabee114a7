//go:build !leasehold_pkgconfig

package leasehold

// The default: the static library of the checkout this package lives in, built at the
// repository root by `cargo build --release`. A module elsewhere reaches it through a replace
// directive pointing at this directory (see README.md). Linked statically, so programs need
// no LD_LIBRARY_PATH.

/*
#cgo CFLAGS: -I${SRCDIR}/../../include
#cgo LDFLAGS: ${SRCDIR}/../../target/release/libleasehold.a -lm -ldl -lpthread
*/
import "C"
