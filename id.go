package sandgate

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
)

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// NewID mints a broker id: prefix followed by 26 characters of Crockford
// base32 (130 bits of randomness). Ids are safe URL path segments and mean
// nothing outside this broker.
func NewID(prefix string) string {
	var b [17]byte
	rand.Read(b[:])
	return prefix + strings.ToLower(idEncoding.EncodeToString(b[:])[:26])
}

// Id prefixes.
const (
	PrefixAccount   = "acct_"
	PrefixInstance  = "inst_"
	PrefixLease     = "lse_"
	PrefixWorkspace = "ws_"
	PrefixSnapshot  = "snap_"
)
