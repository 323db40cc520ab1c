package store

import "strconv"

// Every key sandgate writes is built here; store/README.md lists them with
// their types, TTLs and owners. Keys of one account share the hash tag
// {acct_…} so that an account's multi-key scripts stay in one Redis Cluster
// slot; global keys are only touched by single-key commands.

const prefix = "sg:"

// accountsKey is the SET of every account id. Example: sg:accounts
func accountsKey() string { return prefix + "accounts" }

// accountNamesKey is the HASH of claimed account names: the name,
// trimmed and lower-cased, → the id of the account that has it.
// Example: sg:account_names
func accountNamesKey() string { return prefix + "account_names" }

// accountKey is an account's JSON record. Example: sg:{acct_x}:account
func accountKey(acct string) string { return prefix + "{" + acct + "}:account" }

// instancesKey is the SET of an account's instance ids. Example: sg:{acct_x}:instances
func instancesKey(acct string) string { return prefix + "{" + acct + "}:instances" }

// instanceKey is an instance's JSON record. Example: sg:{acct_x}:inst:inst_y
func instanceKey(acct, inst string) string { return prefix + "{" + acct + "}:inst:" + inst }

// instanceIndexKey maps an instance id to its account id. Example: sg:instance:inst_y
func instanceIndexKey(inst string) string { return prefix + "instance:" + inst }

// leaseIndexKey maps a lease id to its token's SHA-256, for revoking one
// token by its lease id. Example: sg:lease:lse_5x2k…
func leaseIndexKey(id string) string { return prefix + "lease:" + id }

// dataDirKey is the JSON DataDir a host-local provider serves its
// workspaces from. Example: sg:datadir:local
func dataDirKey(provider string) string { return prefix + "datadir:" + provider }

// DataDirKey is the key ClaimDataDir writes, for the operator's message
// on how to retire a data directory. Example: sg:datadir:local
func DataDirKey(provider string) string { return dataDirKey(provider) }

// tokenKey is a lease's JSON record, keyed by the token's SHA-256. Example: sg:token:9f86…
func tokenKey(hash string) string { return prefix + "token:" + hash }

// leasesKey is the SET of token hashes ever issued to an instance. Example: sg:{acct_x}:inst:inst_y:leases
func leasesKey(acct, inst string) string { return prefix + "{" + acct + "}:inst:" + inst + ":leases" }

// liveKey is the ZSET of an instance's concurrency slots: member workspace
// id, score the slot's deadline in unix ms (pending deadline while
// starting, expires_at once running). Example: sg:{acct_x}:inst:inst_y:live
func liveKey(acct, inst string) string { return prefix + "{" + acct + "}:inst:" + inst + ":live" }

// workspaceIndexKey is the ZSET of an instance's workspaces by creation
// time in unix ms, for listing. Example: sg:{acct_x}:inst:inst_y:ws
func workspaceIndexKey(acct, inst string) string {
	return prefix + "{" + acct + "}:inst:" + inst + ":ws"
}

// liveIndexKey is the ZSET of an instance's workspaces not yet terminated
// (starting, running or terminating), scored like workspaceIndexKey: the
// walks of live workspaces read only these, so a terminated workspace
// costs them nothing. Example: sg:{acct_x}:inst:inst_y:ws:live
func liveIndexKey(acct, inst string) string { return workspaceIndexKey(acct, inst) + ":live" }

// workspaceKey is a workspace's HASH record. Example: sg:{acct_x}:ws:ws_z
func workspaceKey(acct, ws string) string { return prefix + "{" + acct + "}:ws:" + ws }

// idempotencyKey is one claimed Idempotency-Key, scoped by (instance,
// operation, key); the client's key is hashed so any length fits.
// Example: sg:{acct_x}:idem:inst_y:acquire:3a7b…
func idempotencyKey(acct, inst, op, keyHash string) string {
	return prefix + "{" + acct + "}:idem:" + inst + ":" + op + ":" + keyHash
}

// invalidateAckKey holds the gateways that dropped their auth caches on
// one invalidation, named by its nonce. Example: sg:invalidate:ack:9f86…
func invalidateAckKey(nonce string) string { return prefix + "invalidate:ack:" + nonce }

// InvalidateChannel is the pub/sub channel on which every change to a
// token, an instance, a control or a price (billing's settings and rate
// cards, through DB.Invalidate) is announced, so gateways drop their
// caches. Example: sg:invalidate
const InvalidateChannel = prefix + "invalidate"

// openKey is the ZSET of an account's open workspaces across all its
// instances, scored like liveKey; the risk check counts it.
// Example: sg:{acct_x}:open
func openKey(acct string) string { return prefix + "{" + acct + "}:open" }

// velocityKey is the ZSET of an account's admissions in the last minute
// (member workspace id, score unix ms), for the risk check's velocity limit.
// Example: sg:{acct_x}:velocity
func velocityKey(acct string) string { return prefix + "{" + acct + "}:velocity" }

// riskKey is the HASH of an account's risk limits set by an operator.
// Example: sg:{acct_x}:risk
func riskKey(acct string) string { return prefix + "{" + acct + "}:risk" }

// controlsKey is the HASH of an account's stop and pause controls: fields
// "stop", "pause" and "pause:<instance id>", each a JSON Control.
// Example: sg:{acct_x}:controls
func controlsKey(acct string) string { return prefix + "{" + acct + "}:controls" }

// globalStopKey is the broker-wide emergency stop, a JSON Control. Example: sg:stop
func globalStopKey() string { return prefix + "stop" }

// controlledKey is the SET of accounts that have (or had) a control, for
// status listings. Example: sg:controlled
func controlledKey() string { return prefix + "controlled" }

// auditKey is the STREAM of the operator audit log: one entry per
// operator action or refused operator request, field "e" the JSON
// AuditEvent, id the event's unix ms. Example: sg:audit
func auditKey() string { return prefix + "audit" }

// auditOnceKey is the ZSET of the names of audit events written once
// (AppendAuditOnce), scored by their entry's unix ms and trimmed with the
// log. Its hash tag puts it in sg:audit's slot. Example: sg:audit:once{sg:audit}
func auditOnceKey() string { return prefix + "audit:once{" + auditKey() + "}" }

// Keys are the account-scoped keys an admission script touches. Every one
// carries the account's hash tag.
type Keys struct {
	Live, Workspace, Idempotency, Index, LiveIndex, Open, Velocity, Risk, Controls string
}

// AdmissionKeys returns the keys an Acquire of workspace ws touches.
func AdmissionKeys(acct, inst, ws, idemKeyHash string) Keys {
	return Keys{
		Live:        liveKey(acct, inst),
		Workspace:   workspaceKey(acct, ws),
		Idempotency: idempotencyKey(acct, inst, OpAcquire, idemKeyHash),
		Index:       workspaceIndexKey(acct, inst),
		LiveIndex:   liveIndexKey(acct, inst),
		Open:        openKey(acct),
		Velocity:    velocityKey(acct),
		Risk:        riskKey(acct),
		Controls:    controlsKey(acct),
	}
}

// snapshotKey is a snapshot's HASH record. Example: sg:{acct_x}:snap:snap_z
func snapshotKey(acct, snap string) string { return prefix + "{" + acct + "}:snap:" + snap }

// snapshotQuotaKey is the ZSET of an instance's snapshots that count
// against max_snapshots: member snapshot id, score its deadline in unix ms
// (the pending deadline while creating, expires_at once live); members at
// or past their deadline no longer count. Example: sg:{acct_x}:inst:inst_y:snaps
func snapshotQuotaKey(acct, inst string) string {
	return prefix + "{" + acct + "}:inst:" + inst + ":snaps"
}

// snapshotBytesKey is the HASH of the sizes of an instance's live
// snapshots: field snapshot id, value the provider's size in bytes, set
// when a snapshot becomes live and removed when its deletion starts. Only
// members of snapshotQuotaKey past now count against max_snapshot_bytes.
// Example: sg:{acct_x}:inst:inst_y:snapbytes
func snapshotBytesKey(acct, inst string) string {
	return prefix + "{" + acct + "}:inst:" + inst + ":snapbytes"
}

// snapshotExpiryKey is the ZSET of an account's snapshots not yet deleted,
// scored like snapshotQuotaKey, for the reaper's TTL sweep.
// Example: sg:{acct_x}:snapexp
func snapshotExpiryKey(acct string) string { return prefix + "{" + acct + "}:snapexp" }

// snapshotGCKey is the ZSET of an account's deleted or expired snapshots
// whose contents the provider has not yet confirmed deleted: member
// snapshot id, score the next attempt in unix ms. Example: sg:{acct_x}:snapgc
func snapshotGCKey(acct string) string { return prefix + "{" + acct + "}:snapgc" }

// commandKey is a durable command's HASH record, keyed by the hex SHA-256
// of its identity. Example: sg:{acct_x}:cmd:ws_z:9f86…
func commandKey(acct, ws, key string) string { return prefix + "{" + acct + "}:cmd:" + ws + ":" + key }

// busyKey is the ZSET of a workspace's durable commands that may be
// running: member command key, score the command's deadline in unix ms.
// Example: sg:{acct_x}:ws:ws_z:busy
func busyKey(acct, ws string) string { return workspaceKey(acct, ws) + ":busy" }

// reaperLeaderKey holds the owner of the reaper's leader lease, with the
// lease's TTL. It shares the hash tag {reaper} with reaperFenceKey so the
// lease scripts touch one Redis Cluster slot. Example: sg:{reaper}:leader
func reaperLeaderKey() string { return prefix + "{reaper}:leader" }

// reaperFenceKey counts leader acquisitions: the current value is the
// fencing token of the lease's holder. Example: sg:{reaper}:fence
func reaperFenceKey() string { return prefix + "{reaper}:fence" }

// brokersKey is the HASH of the broker ids of every gateway that ran on
// this store: field the broker id (the label its providers put on
// sandboxes), value when its reaper last started (unix ms). The leader
// lists each one's sandboxes, so that a crashed gateway's unconfirmed
// creates are swept whatever its broker id. Example: sg:brokers
func brokersKey() string { return prefix + "brokers" }

// revokedKey is the HASH of an account's instances whose tokens an
// operator revoked with their workspaces: field instance id, value the
// revocation's time (unix ms). The reaper ends every workspace of the
// instance created before it (lease_revoked). Example: sg:{acct_x}:revoked
func revokedKey(acct string) string { return prefix + "{" + acct + "}:revoked" }

// egressKeyKey is the broker-wide key of the egress proxy's credentials
// (32 random bytes, set once with SETNX): every gateway of the store
// derives and checks vendor guests' credentials with it.
// Example: sg:egress_key
func egressKeyKey() string { return prefix + "egress_key" }

// refusalsKey is the HASH of the v1 requests refused, by code, broker
// wide, in the minute ("m") or hour ("h") starting at unix second start.
// Example: sg:refusals:h:1796536800
func refusalsKey(unit string, start int64) string {
	return prefix + "refusals:" + unit + ":" + strconv.FormatInt(start, 10)
}

// accountRefusalsKey is refusalsKey's hour bucket for the requests of one
// account's tokens. Example: sg:{acct_x}:refusals:h:1796536800
func accountRefusalsKey(acct string, start int64) string {
	return prefix + "{" + acct + "}:refusals:h:" + strconv.FormatInt(start, 10)
}
