//go:build leasehold_pkgconfig

package leasehold

// With -tags leasehold_pkgconfig: an installed library, found through pkg-config's
// leasehold-static module (scripts/install-lib.sh PREFIX or cmake --install put it in
// PREFIX/lib/pkgconfig), so the package also builds from a read-only module cache.

/*
#cgo pkg-config: leasehold-static
*/
import "C"
