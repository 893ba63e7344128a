"""One decode step after the plan: running it on the backend and publishing its output."""
