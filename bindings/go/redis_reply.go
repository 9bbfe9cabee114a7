package leasehold

// go-redis replies as the core's flat value tree (lh_io_reply), for the Redis
// executor (redis.go): a type mapping only; what a reply means is the core's.

import (
	"fmt"
	"math/big"

	"github.com/redis/go-redis/v9"
)

// flatten turns a go-redis reply into lh_io_reply's pre-order values and one
// data buffer. go-redis reads simple strings as strings: they go as bulk.
func flatten(vals []lhValue, data []byte, v any) ([]lhValue, []byte, error) {
	str := func(kind uint32, s string) {
		vals = append(vals, newValue(kind, 0, len(data), len(s)))
		data = append(data, s...)
	}
	switch x := v.(type) {
	case nil:
		vals = append(vals, newValue(valueNil, 0, 0, 0))
	case int64:
		vals = append(vals, newValue(valueInt, x, 0, 0))
	case bool:
		vals = append(vals, newValue(valueInt, map[bool]int64{true: 1}[x], 0, 0))
	case string:
		str(valueBulk, x)
	case float64, *big.Int:
		str(valueBulk, fmt.Sprint(x))
	case redis.Error:
		str(valueError, x.Error())
	case []any:
		vals = append(vals, newValue(valueArray, 0, 0, len(x)))
		var err error
		for _, e := range x {
			if vals, data, err = flatten(vals, data, e); err != nil {
				return nil, nil, err
			}
		}
	case map[any]any: // RESP3 map: key, value, key, value…
		kv := make([]any, 0, 2*len(x))
		for k, e := range x {
			kv = append(kv, k, e)
		}
		return flatten(vals, data, kv)
	default:
		return nil, nil, fmt.Errorf("leasehold: reply of type %T", v)
	}
	return vals, data, nil
}
