module example.com/leasehold-example

go 1.26.0

// The binding from this checkout; its cgo flags link ../../target/release/libleasehold.a
// (cargo build --release), or an installed library with -tags leasehold_pkgconfig.
replace github.com/leasehold/leasehold/bindings/go => ../../bindings/go

require github.com/leasehold/leasehold/bindings/go v0.0.0-00010101000000-000000000000

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.12.0 // indirect
	github.com/mattn/go-sqlite3 v1.14.53 // indirect
	github.com/redis/go-redis/v9 v9.23.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
	golang.org/x/text v0.41.0 // indirect
)
