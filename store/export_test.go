package store

// ClaimCommandNonce exposes claimCommand: a claim's script sent twice.
var ClaimCommandNonce = (*DB).claimCommand
