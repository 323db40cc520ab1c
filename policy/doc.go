// Package policy holds the lease scope checks and every grammar rule of the
// execution broker protocol v1: ids, idempotency keys, labels, attribution
// fields, env, argv, paths, egress domains and the egress ceiling, sizes,
// images and the exec timeout clamp.
//
// Every refusal a client may see is an error holding a *protocol.Error with
// the code the spec names. Its Message names the field and the rule and is
// safe to show an operator: it never repeats a value that could be content
// (argv, env values, paths, keys that failed their grammar). A label, size,
// image or domain is quoted only after it passed a safe-charset check.
//
// The functions are pure and safe for concurrent use.
package policy
