package admission

// Every key admission itself writes is built here; store/README.md lists
// it with the rest. The admission script's keys are the store's
// (store.AdmissionKeys) and billing's (billing's checks bind their own).

// rateKey is the GCRA theoretical arrival time (unix ms) of one lease's
// requests of one class, a global key touched by one single-key script.
// Example: sg:rl:lse_5x2k…:read
func rateKey(leaseID string, class Class) string { return "sg:rl:" + leaseID + ":" + string(class) }
