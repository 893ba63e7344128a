"""KV cells: the books of who holds which, their operations, the tiers and their ledger."""
