package leasehold

// The byte path of NewExecutor: a Redis URL becomes a RedisStreamExecutor. The core
// reads the URL itself and takes no query (unix:// takes db=N); the go-redis query
// options that have a meaning here become RedisStreamOptions, every other one is
// refused, never dropped.

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// streamSchemes are the Redis URL schemes NewExecutor opens on the byte path unless
// ExecutorOptions.GoRedis is set.
var streamSchemes = map[string]bool{"redis": true, "rediss": true, "unix": true, "redis+sentinel": true, "redis+cluster": true}

// streamQueryKeys are the go-redis query options the byte path maps.
const streamQueryKeys = "client_name, protocol, dial_timeout, read_timeout, db (redis://, rediss://, unix://), skip_verify (rediss://)"

// goRedisHint ends a refusal of a URL that go-redis would have opened.
const goRedisHint = "; ExecutorOptions.GoRedis opens Redis URLs with go-redis (its URL forms and query options)"

// openRedisStream opens a redis://, rediss://, unix://, redis+sentinel:// or redis+cluster:// URL on the
// byte path, with eo.RedisStream's options, eo.Redis's protocol options and the URL's
// mapped query options.
func openRedisStream(rawURL, scheme string, eo *ExecutorOptions) (Executor, error) {
	if err := checkAuthority(rawURL, "Redis"); err != nil {
		return nil, err
	}
	if err := checkURLChars(rawURL); err != nil {
		return nil, err
	}
	var so RedisStreamOptions
	if eo.RedisStream != nil {
		so = *eo.RedisStream
	}
	if eo.Redis != nil {
		r := *eo.Redis
		r.CloseClient = false // a go-redis client's; the stream executor owns its connections
		if so.Redis != (RedisOptions{}) && so.Redis != r {
			return nil, invalidArg("ExecutorOptions: Redis and RedisStream.Redis differ; give the Redis protocol options once")
		}
		so.Redis = r
	}
	coreURL, err := mapStreamQuery(rawURL, scheme, &so)
	if err != nil {
		return nil, err
	}
	if _, after, _ := strings.Cut(coreURL, "://"); scheme == "unix" && !strings.HasPrefix(after, "/") && strings.Contains(after, "@") {
		return nil, invalidArg("Redis URL %s: unix:// on the byte path takes no user name or password%s", redactURL(rawURL), goRedisHint)
	}
	x, err := NewRedisStreamExecutor(coreURL, &so)
	if err != nil {
		return nil, withHint(err)
	}
	return x, nil
}

// withHint adds goRedisHint to an ErrInvalidArgument.
func withHint(err error) error {
	if errors.Is(err, ErrInvalidArgument) {
		return fmt.Errorf("%w%s", err, goRedisHint)
	}
	return err
}

// mapStreamQuery moves rawURL's query options into so and returns the URL the core
// reads. An option the byte path has no use for is an error naming it.
func mapStreamQuery(rawURL, scheme string, so *RedisStreamOptions) (string, error) {
	base, rawQuery, hasQuery := strings.Cut(rawURL, "?")
	if !hasQuery {
		return rawURL, nil
	}
	frag := ""
	if i := strings.IndexByte(rawQuery, '#'); i >= 0 {
		rawQuery, frag = rawQuery[:i], rawQuery[i:]
	}
	q, err := url.ParseQuery(rawQuery)
	if err != nil {
		return "", invalidArg("bad Redis URL %s: its query does not parse", redactURL(rawURL))
	}
	bad := func(format string, a ...any) error {
		return invalidArg("Redis URL %s: "+format, append([]any{redactURL(rawURL)}, a...)...)
	}
	var unknown []string
	keep := url.Values{}
	for k, vs := range q {
		if len(vs) != 1 {
			return "", bad("query option %s given %d times", k, len(vs))
		}
		v := vs[0]
		switch k {
		case "client_name":
			if err := setOnce(&so.ClientName, v, "ClientName"); err != nil {
				return "", bad("%s", err)
			}
		case "protocol":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > 3 {
				return "", bad("protocol is 2 or 3 (1: AUTH/SELECT only)")
			}
			if err := setOnce(&so.Protocol, n, "Protocol"); err != nil {
				return "", bad("%s", err)
			}
		case "dial_timeout", "read_timeout":
			d, err := queryDuration(v)
			if err != nil {
				return "", bad("%s: %s", k, err)
			}
			field, name := &so.ConnectTimeout, "ConnectTimeout"
			if k == "read_timeout" {
				field, name = &so.CommandTimeout, "CommandTimeout"
			}
			if err := setOnce(field, d, name); err != nil {
				return "", bad("%s", err)
			}
		case "skip_verify":
			on, err := strconv.ParseBool(v)
			if err != nil {
				return "", bad("skip_verify takes true or false")
			}
			if scheme != "rediss" {
				return "", bad("skip_verify applies to rediss:// only")
			}
			if on {
				cfg := &tls.Config{}
				if so.TLSConfig != nil {
					cfg = so.TLSConfig.Clone()
				}
				cfg.InsecureSkipVerify = true
				so.TLSConfig = cfg
			}
		case "db":
			switch scheme {
			case "unix":
				keep.Set(k, v) // the core's own
			case "redis", "rediss":
				if _, err := strconv.ParseUint(v, 10, 32); err != nil {
					return "", bad("bad database number")
				}
				_, after, _ := strings.Cut(base, "://")
				if _, path, ok := strings.Cut(after, "/"); ok && path != "" && path != v {
					return "", bad("two database numbers (the path and db=)")
				}
				if i := strings.Index(after, "/"); i >= 0 {
					base = base[:len(base)-len(after)+i]
				}
				base += "/" + v
			case "redis+sentinel":
				return "", bad("the database is the path: /MASTER/DB")
			default:
				return "", bad("db is not an option of %s:// URLs", scheme)
			}
		default:
			unknown = append(unknown, k)
		}
	}
	if len(unknown) > 0 {
		slices.Sort(unknown)
		return "", bad("query options not read on the byte path: %s (it reads %s)%s",
			strings.Join(unknown, ", "), streamQueryKeys, goRedisHint)
	}
	if len(keep) > 0 {
		base += "?" + keep.Encode()
	}
	return base + frag, nil
}

// setOnce sets *field to v unless the options already hold another value.
func setOnce[T comparable](field *T, v T, name string) error {
	var zero T
	if *field != zero && *field != v {
		return fmt.Errorf("the URL and RedisStreamOptions.%s differ", name)
	}
	*field = v
	return nil
}

// queryDuration reads a go-redis duration: whole seconds or a Go duration; the byte
// path has no unbounded timeout.
func queryDuration(v string) (time.Duration, error) {
	d, err := time.ParseDuration(v)
	if n, err2 := strconv.Atoi(v); err2 == nil {
		d, err = time.Duration(n)*time.Second, nil
	}
	if err != nil {
		return 0, errors.New("want a duration (3s, 500ms) or whole seconds")
	}
	if d <= 0 {
		return 0, errors.New("the byte path has no unbounded timeout (want a positive duration)")
	}
	return d, nil
}

// checkURLChars refuses what a URL may not hold (net/url's rules, which go-redis applies):
// a space or control character anywhere, and in the user name or password anything but
// letters, digits, percent escapes and -._~!$&'()*+,;=:.
func checkURLChars(rawURL string) error {
	for _, r := range rawURL {
		if r <= ' ' || r == 0x7f {
			return invalidArg("bad Redis URL %s: a space or control character (percent-encode it)", redactURL(rawURL))
		}
	}
	_, rest, _ := strings.Cut(rawURL, "://")
	authority, _, _ := strings.Cut(rest, "/")
	if at := strings.LastIndex(authority, "@"); at >= 0 {
		if strings.Trim(authority[:at], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=:%") != "" {
			return invalidArg("bad Redis URL %s: the user name or password holds a character a URL may not (percent-encode it)", redactURL(rawURL))
		}
	}
	return nil
}
