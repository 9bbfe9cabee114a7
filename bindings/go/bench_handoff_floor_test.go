package leasehold

// The Redis handoff floor: the protocol's own steps for one handoff with no library, beside
// BenchmarkHandoff's leasehold and stream variants (the same harness, a goroutine per waiter).
// One handoff is the holder's RELEASE script (it pops the oldest queued entry and publishes
// "w TOKEN NAME" to that entry's channel), the message reaching the waiter's subscriber
// connection, and the waiter's ACQUIRE script with queued = 1, which grants. The scripts, keys
// and arguments are the ones the core sends, recorded once (recordStreamCycle); each waiter
// only puts in its own token and wake channel (docs/redis-protocol.md: ARGV of ACQUIRE
// [token, ttl_ms, entry, keep_ms, name, queued], of RELEASE [token, name, max_age_ms]).
//
//	go test -run '^$' -bench '^BenchmarkHandoff(Floor)?$' -benchtime 300x

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"
)

func BenchmarkHandoffFloor(b *testing.B) {
	name := uniq(b, "hf")
	acq, rel := recordStreamCycle(b, name)
	acquire, release := respArgv(b, acq), respArgv(b, rel)
	if len(acquire) != 12 || len(release) != 8 {
		b.Fatalf("recorded scripts of an unexpected shape: ACQUIRE %d, RELEASE %d arguments", len(acquire), len(release))
	}
	handoff(b, func() lockFunc { return floorWaiter(b, acquire, release) })
}

// respArgv reads one recorded command (a RESP array of bulk strings).
func respArgv(b *testing.B, raw []byte) [][]byte {
	r := bufio.NewReader(bytes.NewReader(raw))
	head, err := r.ReadString('\n')
	if err != nil || head[0] != '*' {
		b.Fatalf("recorded command %q is not an array", raw)
	}
	n, _ := strconv.Atoi(head[1 : len(head)-2])
	argv := make([][]byte, n)
	for i := range argv {
		line, err := r.ReadString('\n')
		if err != nil || line[0] != '$' {
			b.Fatalf("recorded command %q: argument %d is not a bulk string", raw, i)
		}
		size, _ := strconv.Atoi(line[1 : len(line)-2])
		argv[i] = make([]byte, size+2)
		if _, err := io.ReadFull(r, argv[i]); err != nil {
			b.Fatal(err)
		}
		argv[i] = argv[i][:size]
	}
	return argv
}

func respCommand(argv [][]byte) []byte {
	out := fmt.Appendf(nil, "*%d\r\n", len(argv))
	for _, a := range argv {
		out = fmt.Appendf(out, "$%d\r\n%s\r\n", len(a), a)
	}
	return out
}

// respInts reads a reply that is an integer or an array of integers.
func respInts(r *bufio.Reader) ([]int64, error) {
	head, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	switch head[0] {
	case ':':
		v, err := strconv.ParseInt(head[1:len(head)-2], 10, 64)
		return []int64{v}, err
	case '*':
		n, _ := strconv.Atoi(head[1 : len(head)-2])
		out := make([]int64, 0, n)
		for i := 0; i < n; i++ {
			v, err := respInts(r)
			if err != nil {
				return nil, err
			}
			out = append(out, v...)
		}
		return out, nil
	}
	return nil, fmt.Errorf("floor: unexpected reply %q", head)
}

// floorWaiter is one bare waiter: a commands connection, and a subscriber connection on a
// wake channel of its own whose reader goroutine passes on the wake-ups naming its token.
func floorWaiter(b *testing.B, acquire, release [][]byte) lockFunc {
	dial := func() net.Conn {
		c, err := net.Dial("tcp", needRedis(b))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		return c
	}
	cmd, sub := dial(), dial()
	cr, sr := bufio.NewReader(cmd), bufio.NewReader(sub)
	raw := make([]byte, 32)
	_, _ = rand.Read(raw)
	token := []byte(hex.EncodeToString(raw[:16]))
	channel := []byte("lh:wake:" + hex.EncodeToString(raw[16:]))
	args := func(queued string) []byte {
		a := append([][]byte(nil), acquire...)
		a[6], a[8], a[11] = token, append(append(append([]byte(nil), channel...), '#'), token...), []byte(queued)
		return respCommand(a)
	}
	first, again := args("0"), args("1")
	r := append([][]byte(nil), release...)
	r[5] = token
	releaseCall := respCommand(r)
	if _, err := sub.Write(respCommand([][]byte{[]byte("SUBSCRIBE"), channel})); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < 6; i++ { // the confirmation: *3, $9, subscribe, $N, channel, :1
		if _, err := sr.ReadString('\n'); err != nil {
			b.Fatal(err)
		}
	}
	wake := make(chan struct{}, 16)
	prefix := append([]byte("w "), token...)
	go func() { // messages: *3 $7 message $N channel $M payload
		for {
			var lines [7]string
			for i := range lines {
				line, err := sr.ReadString('\n')
				if err != nil {
					return
				}
				lines[i] = line
			}
			if bytes.HasPrefix([]byte(lines[6]), prefix) {
				select {
				case wake <- struct{}{}:
				default:
				}
			}
		}
	}()
	call := func(payload []byte) ([]int64, error) {
		if _, err := cmd.Write(payload); err != nil {
			return nil, err
		}
		return respInts(cr)
	}
	return func(ctx context.Context) (func() error, error) {
		payload := first
		for {
			reply, err := call(payload)
			if err != nil {
				return nil, err
			}
			if len(reply) > 1 && reply[0] == 1 {
				return func() error {
					v, err := call(releaseCall)
					if err == nil && (len(v) != 1 || v[0] != 1) {
						err = fmt.Errorf("floor: RELEASE found another owner")
					}
					return err
				}, nil
			}
			payload = again
			wait := time.Millisecond
			if len(reply) > 1 && reply[1] > 0 {
				wait = time.Duration(reply[1]) * time.Millisecond
			}
			select { // its wake-up, or the holder's time is up: ask again
			case <-wake:
			case <-time.After(wait):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
}
