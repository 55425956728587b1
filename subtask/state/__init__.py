"""The lock-guarded files beside the repository: slots, the ledger, run-locks, a job's kept
environment and words, atomic private writes."""
